# Assembles an install or upgrade script (the Makefile runs it): one text
# for an object's definition, wherever a script needs it.
#
# In an install fragment (sql/install/*.sql), the lines of an object's
# definition may be marked
#     -- @object NAME
#     CREATE FUNCTION ...;
#     COMMENT ON FUNCTION ...;
#     -- @end
# (NAME: any word, unique across sql/install/; blocks do not nest). In a
# hand-written upgrade delta (sql/upgrade/<from>--<to>/*.sql) a line
#     -- @include NAME
# stands for the block's lines as they are, and a line
#     -- @replace NAME
# for the same lines with CREATE FUNCTION / PROCEDURE / VIEW made CREATE OR
# REPLACE (an object that the old version already has). The markers
# themselves never reach a script.
#
#   awk -f include.awk out=1 INSTALL_PARTS                  (install script)
#   awk -f include.awk INSTALL_PARTS out=1 UPGRADE_PARTS    (upgrade script)
#
# Files before out=1 are only read for their blocks; files after it are
# printed, markers dropped and @include / @replace lines expanded. Any
# mistake (unknown or duplicate name, unclosed or nested block, a stray
# @end) stops the build.
function fail_at(file, line, msg) {
    printf "%s:%d: %s\n", file, line, msg > "/dev/stderr"
    failed = 1
    exit 1
}
function fail(msg) { fail_at(FILENAME, FNR, msg) }
function check_closed() {
    if (open != "")
        fail_at(open_file, open_line, "-- @object " open " is not closed by -- @end in its file")
}
FNR == 1 { check_closed() }
/^-- @object / {
    if (NF != 3) fail("expected: -- @object NAME")
    if (open != "") fail("-- @object " $3 " inside -- @object " open)
    open = $3
    open_file = FILENAME
    open_line = FNR
    if (!out) {
        if (open in count) fail("-- @object " open " is defined twice")
        count[open] = 0
    }
    next
}
/^-- @end[ \t]*$/ {
    if (open == "") fail("-- @end without -- @object")
    open = ""
    next
}
!out {
    if (open != "") body[open, ++count[open]] = $0
    next
}
/^-- @(include|replace) / {
    if (NF != 3) fail("expected: " $2 " NAME")
    if (open != "") fail($2 " inside -- @object " open)
    if (!($3 in count)) fail("no -- @object " $3 " in the install fragments")
    for (i = 1; i <= count[$3]; i++) {
        line = body[$3, i]
        if ($2 == "@replace" && line ~ /^CREATE (FUNCTION|PROCEDURE|VIEW) /)
            line = "CREATE OR REPLACE " substr(line, 8)
        print line
    }
    next
}
/^-- @/ { fail("unknown directive " $2) }
{ print }
END {
    if (!failed) check_closed()
}
