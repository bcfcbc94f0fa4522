"""The results layer, below both the harness (``eagle2.bench``, which writes rows) and ``analysis`` (which
reads them): the store, the row schema, the method specs the config hash reads, throughput maths, rows as
frames and the identity audit's records. It imports no torch-side layer (only ``eagle2.core.cpu``)."""
