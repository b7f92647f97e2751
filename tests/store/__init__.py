"""The SQLite store and what reads it (the uploader's HistoryReader), on real files."""
