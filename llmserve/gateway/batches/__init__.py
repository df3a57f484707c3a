"""The Batch API: ``/v1/files`` and ``/v1/batches``, durable in the gateway's state folder.

``store`` owns the SQLite file (files, batches, one row per line), ``lines`` reads an
input file into lines (pure), ``runner`` sends pending lines through the gateway's
own chat path at the batch priority class, ``routes`` is the HTTP side.
"""
