"""The processing element: a region's pipelines at once in forked processes, batches over pipes."""
