\echo Use "ALTER EXTENSION sharding UPDATE TO '1.4'" to load this file. \quit

-- Version 1.3 -> 1.4. Assembled by the Makefile from the hand-written deltas
-- in sql/upgrade/1.3--1.4/, in order of file name: each changes or adds the
-- objects of one topic so that an updated database equals a fresh install
-- of sql/install/ (test/harness/upgrade.sh compares their catalogs). Once
-- 1.4 is released the assembled script is frozen as
-- sql/sharding--1.3--1.4.sql, as 1.2 -> 1.3 was.
