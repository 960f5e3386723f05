
-- One list of the configuration tables followers copy
-- (sharding._config_tables, new): the publication, the node's emptying
-- before it follows and attach_node's wait for the copy (40_fixes.sql
-- includes attach_node) read it instead of three copies and a count.
-- @include sharding._config_tables
-- @replace sharding._publish_config
-- @replace sharding._follow
