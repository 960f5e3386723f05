\echo Use "ALTER EXTENSION sharding UPDATE TO '1.2'" to load this file. \quit

-- Version 1.1 → 1.2. This script is assembled by the Makefile from
-- sql/upgrade/1.1--1.2/*.sql (changes to objects that 1.1 already had) and
-- the install fragments sql/install/8*.sql and 9*.sql (topics new in 1.2),
-- in order of file name. Once 1.2 is released the assembled script is frozen
-- as sql/sharding--1.1--1.2.sql, as 1.0 → 1.1 was.
