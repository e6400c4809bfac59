"""Filesystem primitives the whole package shares, one module each: confinement, temp names,
atomic writes, a destination's state directory, locks, the destination tree, reading files a job
controls, and file digests.

Why together, in one package: each is a property of the whole package ("nothing is ever written
outside the destination", "a reader never sees half a file", "two writers never interleave"), and
a second copy of any of them is a bug waiting to drift. Everything that writes, locks, hashes or
checks containment comes here — to the module that holds that one property:

- :mod:`.confinement` — which relative names may be written (:func:`~.confinement.check_relative`,
  :func:`~.confinement.confined_path`), :func:`~.confinement.is_within`, a path opened without
  following a link, and the names tao-data-io reserves;
- :mod:`.temp` — in-flight files' names, who owns them, removing those killed writers left;
- :mod:`.atomic` — :func:`~.atomic.atomic_write`: a file whole or not at all;
- :mod:`.state` — a destination's state directory, made and opened safely, and what is read in it;
- :mod:`.locks` — :func:`~.locks.file_lock` and the lock every writer of a destination holds;
- :mod:`.tree` — :class:`~.tree.DestinationTree`: writes through directory descriptors only;
- :mod:`.reading` — reading a file a job controls: the one scanned, no more than scanned;
- :mod:`.digest` — :func:`~.digest.file_digest`.

Nothing is exported here — each importer names the module that holds what it uses — but
:class:`~.reading.ReplacedError`, under the name it had when this was one module: a flow whose run
failed with it has it stored by that name (Prefect's JSON result serializer keeps an exception as
its qualified name, ``tao_data_io.fs.ReplacedError``, and rebuilds it from there).
"""

from .reading import ReplacedError as ReplacedError  # re-exported: see above
