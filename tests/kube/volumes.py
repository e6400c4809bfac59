"""The kubelet's and the kernel's side of a claim's volume, for the API stand-in: who owns what
on it, what a pod's fsGroup changes, what a container's identity may write, and the subPaths
the kubelet creates. Written from the rules, not from the code under test:

* **fsGroup** (core/v1 ``PodSecurityContext.fsGroup``; pkg/volume/volume_linux.go
  ``SetVolumeOwnership``): on a volume whose plugin supports ownership management, every file's
  group becomes the fsGroup, its permission bits are OR'd with ``rw-rw----`` (directories also
  get ``g+x`` and setgid). ``fsGroupChangePolicy: OnRootMismatch`` skips the walk when the root
  already has that group and those bits.
* **Which volumes apply it**: NFS and hostPath volumes "do not support ownership management"
  (core/v1 ``NFSVolumeSource``, ``HostPathVolumeSource``); a CSI volume follows its CSIDriver's
  ``fsGroupPolicy`` (storage/v1 ``CSIDriverSpec``): ``File`` always, ``None`` never, and the
  default ``ReadWriteOnceWithFSType`` only when the volume has an fsType and its access modes
  contain ReadWriteOnce (pkg/volume/csi/csi_mounter.go ``supportsFSGroup``).
* **A container's identity**: ``runAsUser``/``runAsGroup`` (container over pod) or the image's
  user; its supplementary groups are the fsGroup and ``supplementalGroups``. Creating an entry
  needs write and search on its directory, and search on every directory above (POSIX); uid 0
  may do anything. A new directory is ``0755`` (umask 022) owned by the creator, with the group
  and the setgid bit of a setgid parent (Linux).
* **A missing subPath** is created by the kubelet when a container that mounts it starts
  (pkg/kubelet/kubelet_pods.go ``makeMounts``: ``SafeMakeDir`` with the volume root's mode),
  owned by root: an empty directory where a file or a dataset was expected.
"""

from __future__ import annotations

import posixpath
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Inode:
    uid: int = 0
    gid: int = 0
    mode: int = 0o755
    directory: bool = True


@dataclass(frozen=True)
class Identity:
    uid: int
    gid: int
    groups: frozenset[int] = frozenset()

    def member(self, gid: int) -> bool:
        return gid == self.gid or gid in self.groups


@dataclass
class Volume:
    """One PersistentVolume's filesystem. ``tree`` maps a path relative to the volume's root ("")
    to its inode; a freshly provisioned volume is only its root, ``root:root 0755``.
    ``contents`` says whether the tree is the whole truth (a test seeded what is pre-positioned
    there) or only its ownership is modelled, so a path the tree lacks may still exist."""

    ownership: bool
    tree: dict[str, Inode] = field(default_factory=lambda: {"": Inode()})
    contents: bool = False

    # ----------------------------------------------------------------- what the kubelet does
    def apply_fs_group(self, fs_group: int, policy: str | None) -> None:
        if not self.ownership:
            return
        root = self.tree[""]
        if policy == "OnRootMismatch" and root.gid == fs_group and _has_group_bits(root):
            return
        for inode in self.tree.values():
            inode.gid = fs_group
            inode.mode |= 0o660
            if inode.directory:
                inode.mode |= 0o110 | stat.S_ISGID

    def make_subpath(self, path: str) -> bool:
        """The kubelet's ``SafeMakeDir`` of a missing subPath; whether it created anything."""
        path = _normal(path)
        if self.exists(path) or not self.contents:
            return False
        mode = stat.S_IMODE(self.tree[""].mode)
        for part in _ancestors(path, include_self=True):
            self.tree.setdefault(part, Inode(0, 0, mode))
        return True

    # ----------------------------------------------------------------- what a container does
    def exists(self, path: str) -> bool:
        return _normal(path) in self.tree

    def make_dirs(self, path: str, who: Identity) -> str | None:
        """``mkdir -p`` as ``who``: None when done, else the existing directory that refused."""
        for part in _ancestors(_normal(path), include_self=True):
            if part in self.tree:
                continue
            parent = posixpath.dirname(part)
            if not self.may_create_in(parent, who):
                return parent
            above = self.tree[parent]
            setgid = bool(above.mode & stat.S_ISGID)
            self.tree[part] = Inode(who.uid, above.gid if setgid else who.gid, 0o755 | (stat.S_ISGID if setgid else 0))
        return None

    def may_create_in(self, directory: str, who: Identity) -> bool:
        if who.uid == 0:
            return True
        if not all(_allows(self.tree[part], who, 0o1) for part in _ancestors(directory, include_self=False)):
            return False
        return _allows(self.tree[directory], who, 0o3)


def supports_fs_group(persistent_volume: dict[str, Any], drivers: dict[str, dict[str, Any]]) -> bool:
    """Whether the kubelet applies a pod's fsGroup to this PersistentVolume (module docstring)."""
    spec = persistent_volume.get("spec") or {}
    if "nfs" in spec or "hostPath" in spec:
        return False
    if "csi" in spec:
        csi = spec["csi"]
        policy = ((drivers.get(csi.get("driver")) or {}).get("spec") or {}).get("fsGroupPolicy",
                                                                              "ReadWriteOnceWithFSType")
        if policy == "File":
            return True
        if policy == "None":
            return False
        return bool(csi.get("fsType")) and "ReadWriteOnce" in (spec.get("accessModes") or [])
    return True  # local, block devices: the in-tree plugins that manage ownership


def identity_of(pod_spec: dict[str, Any], container: dict[str, Any],
                image_users: dict[str, tuple[int, int]]) -> Identity:
    pod_context = pod_spec.get("securityContext") or {}
    context = {**pod_context, **(container.get("securityContext") or {})}
    uid, gid = image_users.get(container["image"], (0, 0))
    groups = set(pod_context.get("supplementalGroups") or [])
    if "fsGroup" in pod_context:
        groups.add(pod_context["fsGroup"])
    return Identity(context.get("runAsUser", uid), context.get("runAsGroup", gid), frozenset(groups))


def _allows(inode: Inode, who: Identity, bits: int) -> bool:
    """POSIX: the owner's bits for the owner, else the group's for a member, else the others'."""
    if who.uid == inode.uid:
        shift = 6
    elif who.member(inode.gid):
        shift = 3
    else:
        shift = 0
    return (inode.mode >> shift) & bits == bits


def _has_group_bits(inode: Inode) -> bool:
    return inode.mode & 0o770 == 0o770 and bool(inode.mode & stat.S_ISGID)


def _normal(path: str) -> str:
    return posixpath.normpath(path).strip("/") if path.strip("/") else ""


def _ancestors(path: str, *, include_self: bool) -> Iterable[str]:
    """"", "a", "a/b" for "a/b/c" (and "a/b/c" with ``include_self``)."""
    parts = path.split("/") if path else []
    yield ""
    for end in range(1, len(parts) + (1 if include_self else 0)):
        yield "/".join(parts[:end])
