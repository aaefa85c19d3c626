-- migrations/0005_applied_vocabulary.sql rewrote rows logged before the vocabulary; no
-- PostgreSQL log predates it. Kept so that both backends number the same migrations.
SELECT 1;
