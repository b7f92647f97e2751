"""Edge uploader of history batches and the central Spark jobs."""
