"""Text for people: show, the plan digest, the summary's rows and sentences, progress,
the live queues view."""
