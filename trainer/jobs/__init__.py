"""Jobs: the queue interface, job messages and submit."""
