-- shoal schema version 16: on PostgreSQL, a root run records that its tree has keys, so that the
-- runs_ended trigger fires only for the runs that need it. SQLite's runs_ended trigger also
-- counts every run that ends (run_counts), so it fires for every run anyway, and its probe of
-- tree_keys costs next to nothing in process: nothing changes here. The version exists on both
-- backends so that a version number means the same code on both.
SELECT 1;
