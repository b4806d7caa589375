"""Where records come from and go to on Spark: sources, sinks, a file source's staging and batch size, and what a bounded run left unread."""
