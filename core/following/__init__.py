"""Following: web pages, calendar feeds, teams and TV shows whose events show in the agenda.

``core.following.store`` keeps what is followed and the events it gives; ``pages`` reads a plain
web page at the cost of at most one model call per change; ``match`` pairs old and new events;
``checks`` runs the due checks with leases (the scheduler calls it). Teams and shows come from
structured sources behind their adapters (``core.adapters.sportsdb``, ``core.adapters.tvmaze``).
"""
