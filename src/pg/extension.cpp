// The extension in the current database: see extension.hpp.
#include "pg/extension.hpp"

extern "C" {
#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "catalog/dependency.h"
#include "catalog/indexing.h"
#include "catalog/pg_extension.h"
#include "catalog/pg_proc.h"
#include "utils/fmgroids.h"
#include "utils/syscache.h"
}

namespace sharding {

Extension find_extension() {
    Extension e{InvalidOid, InvalidOid, InvalidOid};
    Relation rel = table_open(ExtensionRelationId, AccessShareLock);
    ScanKeyData key;
    ScanKeyInit(&key, Anum_pg_extension_extname, BTEqualStrategyNumber, F_NAMEEQ, CStringGetDatum("sharding"));
    SysScanDesc scan = systable_beginscan(rel, ExtensionNameIndexId, true, nullptr, 1, &key);
    HeapTuple tup = systable_getnext(scan);
    if (HeapTupleIsValid(tup)) {
        Form_pg_extension f = reinterpret_cast<Form_pg_extension>(GETSTRUCT(tup));
        e = Extension{f->oid, f->extowner, f->extnamespace};
    }
    systable_endscan(scan);
    table_close(rel, AccessShareLock);
    return e;
}

Oid extension_function(const Extension &e, const char *name, int nargs, const Oid *argtypes) {
    oidvector *args = buildoidvector(argtypes, nargs);
    HeapTuple tup = SearchSysCache3(PROCNAMEARGSNSP, CStringGetDatum(name), PointerGetDatum(args),
                                    ObjectIdGetDatum(e.schema));
    if (!HeapTupleIsValid(tup)) return InvalidOid;
    Oid fn = reinterpret_cast<Form_pg_proc>(GETSTRUCT(tup))->oid;
    ReleaseSysCache(tup);
    return getExtensionOfObject(ProcedureRelationId, fn) == e.oid ? fn : InvalidOid;
}

}  // namespace sharding
