"""The batch side: ``archive`` (plain pika), ``report`` and ``replay`` (PySpark).

``records`` is the archive's line format, shared by the archiver that writes
it and the replay that reads it. Only ``report`` and ``replay`` import PySpark,
and only through ``spark``, which turns its absence into exit code 2.
"""
