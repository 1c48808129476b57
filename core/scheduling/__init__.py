"""Scheduled tasks: schedules (when occurrences fall) and the tasks in the store."""
