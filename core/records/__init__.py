"""Records: the statements for each table or group of tables, as plain async functions over a
:class:`~core.store.queries.Queries` (a ``Database``, a pool or a connection in a transaction).

Only ``core`` holds SQL (``tests/test_architecture.py`` checks it): the layers above call these
functions and never write a statement of their own.
"""
