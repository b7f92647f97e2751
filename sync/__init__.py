"""The edge uploader: history after the watermark -> batch files -> a sink -> the watermark."""
