"""Records as the workers carry them: carried batches and envelopes, Arrow rows, a record's fate."""
