"""The restricted call profile for forwarded calls: take a message, book against free/busy."""
