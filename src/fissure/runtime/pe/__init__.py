"""The processing element: a region's pipelines running at once in forked processes, batches passed over pipes."""
