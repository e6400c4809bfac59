"""The Pod Security Standards as the API stand-in's admission enforces them, written from the
standard (kubernetes.io/docs/concepts/security/pod-security-standards) and held to upstream's own
pass/fail fixtures (``tests/data/pod-security/``, from kubernetes/pod-security-admission
``test/testdata/<level>/v<version>/``) by ``test_the_stand_ins_pod_security_agrees_with_upstreams
_fixtures``, and by version where a check changed (safe sysctls, SELinux types). Each refusal
has pod-security-admission's form (policy/check_*.go: ``<reason> (<detail>)``, reasons verbatim,
details in its words for the fields a job's pods set), joined into the 403 the API server answers.

``baseline`` refuses the known privilege escalations; ``restricted`` adds the hardening rules,
three of which (allowPrivilegeEscalation, capabilities, seccomp) do not apply to a pod whose
``spec.os.name`` is ``windows``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

LEVELS = ("baseline", "restricted")
#: Capabilities baseline lets a container add (check_capabilities_baseline).
BASELINE_CAPABILITIES = frozenset({"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                                   "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"})
#: seLinuxOptions.type values baseline allows (with no user or role), by the version that
#: allowed each (check_seLinuxOptions: container_engine_t from 1.31).
SELINUX_TYPES: dict[tuple[int, int], frozenset[str]] = {
    (1, 0): frozenset({"", "container_t", "container_init_t", "container_kvm_t"}),
    (1, 31): frozenset({"container_engine_t"}),
}
#: The safe sysctls, by the version that made each safe (check_sysctls).
SAFE_SYSCTLS: dict[tuple[int, int], frozenset[str]] = {
    (1, 0): frozenset({"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.tcp_syncookies",
                       "net.ipv4.ping_group_range", "net.ipv4.ip_unprivileged_port_start"}),
    (1, 27): frozenset({"net.ipv4.ip_local_reserved_ports"}),
    (1, 29): frozenset({"net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
                        "net.ipv4.tcp_keepalive_probes"}),
    (1, 32): frozenset({"net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem"}),
}
#: The only volume types restricted allows (check_restrictedVolumes).
RESTRICTED_VOLUMES = frozenset({"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                                "projected", "secret"})
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"
LATEST = (1, 32)


Pod = dict[str, Any]


def _containers(spec: Pod) -> list[Pod]:
    return [*spec.get("initContainers", []), *spec.get("containers", []), *spec.get("ephemeralContainers", [])]


def _context(container: Pod) -> Pod:
    return container.get("securityContext") or {}


def _who(names: list[str], noun: str = "container") -> str:
    return f"{noun}{'s' if len(names) > 1 else ''} " + ", ".join(f'"{n}"' for n in names)


def _setters(pod_bad: bool, names: list[str]) -> str:
    """"pod and containers "a", "b"": who set a forbidden value."""
    return " and ".join([*(["pod"] if pod_bad else []), *([_who(names)] if names else [])])


def _windows(spec: Pod) -> bool:
    return (spec.get("os") or {}).get("name") == "windows"


# ----------------------------------------------------------------------------- baseline
def _app_armor(meta: Pod, spec: Pod, version: tuple[int, int]) -> str | None:
    """An annotation may name no profile (empty), runtime/default or localhost/*; a field may not
    be Unconfined (1.30+)."""
    annotated = sorted(f'{key}="{value}"' for key, value in (meta.get("annotations") or {}).items()
                       if key.startswith(APPARMOR_ANNOTATION) and value not in ("", "runtime/default")
                       and not value.startswith("localhost/"))
    pod_bad = ((spec.get("securityContext") or {}).get("appArmorProfile") or {}).get("type") == "Unconfined"
    names = [c["name"] for c in _containers(spec)
             if (_context(c).get("appArmorProfile") or {}).get("type") == "Unconfined"]
    details = [", ".join(annotated)] if annotated else []
    if pod_bad or names:
        details.append(f'{_setters(pod_bad, names)} must not set AppArmor profile type to "Unconfined"')
    if not details:
        return None
    count = len(annotated) + int(pod_bad or bool(names))
    return f"forbidden AppArmor profile{'s' if count > 1 else ''} ({'; '.join(details)})"


def _capabilities_baseline(meta: Pod, spec: Pod, version: tuple[int, int]) -> str | None:
    bad = {c["name"]: sorted(set(_context(c).get("capabilities", {}).get("add") or []) - BASELINE_CAPABILITIES)
           for c in _containers(spec)}
    names = [name for name, caps in bad.items() if caps]
    if not names:
        return None
    caps = sorted({cap for name in names for cap in bad[name]})
    return (f"non-default capabilities ({_who(names)} must not include " + ", ".join(f'"{c}"' for c in caps)
            + " in securityContext.capabilities.add)")


def _host_namespaces(meta: Pod, spec: Pod, version: tuple[int, int]) -> str | None:
    on = [f"{name}=true" for name in ("hostNetwork", "hostPID", "hostIPC") if spec.get(name) is True]
    return f"host namespaces ({', '.join(on)})" if on else None


def _host_path_volumes(meta: Pod, spec: Pod, version: tuple[int, int]) -> str | None:
    names = [v["name"] for v in spec.get("volumes", []) if "hostPath" in v]
    return f"hostPath volumes ({_who(names, 'volume')})" if names else None


def _host_ports(meta: Pod, spec: Pod, version: tuple[int, int]) -> str | None:
    used = {c["name"]: [p["hostPort"] for p in c.get("ports") or [] if p.get("hostPort")] for c in _containers(spec)}
    names = [name for name, ports in used.items() if ports]
    if not names:
        return None
    ports = sorted({str(port) for name in names for port in used[name]})  # as strings, as upstream sorts them
    return f"hostPort ({_who(names)} use{'s' if len(names) == 1 else ''} hostPort{'s' if len(ports) > 1 else ''} " \
           + ", ".join(map(str, ports)) + ")"


def _privileged(meta: Pod, spec: Pod, version: tuple[int, int]) -> str | None:
    names = [c["name"] for c in _containers(spec) if _context(c).get("privileged") is True]
    return f"privileged ({_who(names)} must not set securityContext.privileged=true)" if names else None


def _proc_mount(meta: Pod, spec: Pod, version: tuple[int, int]) -> str | None:
    bad = {c["name"]: _context(c)["procMount"] for c in _containers(spec)
           if _context(c).get("procMount", "Default") != "Default"}
    if not bad:
        return None
    return (f"procMount ({_who(list(bad))} must not set securityContext.procMount to "
            + ", ".join(f'"{v}"' for v in sorted(set(bad.values()))) + ")")


def _se_linux_options(meta: Pod, spec: Pod, version: tuple[int, int]) -> str | None:
    types = frozenset().union(*(names for since, names in SELINUX_TYPES.items() if since <= version))

    def bad(options: Pod | None) -> bool:
        return bool(options) and (options.get("type", "") not in types or bool(options.get("user"))  # type: ignore[union-attr]
                                  or bool(options.get("role")))  # type: ignore[union-attr]
    pod_bad = bad((spec.get("securityContext") or {}).get("seLinuxOptions"))
    names = [c["name"] for c in _containers(spec) if bad(_context(c).get("seLinuxOptions"))]
    if not (pod_bad or names):
        return None
    return f"seLinuxOptions ({_setters(pod_bad, names)} set forbidden securityContext.seLinuxOptions)"


def _seccomp_baseline(meta: Pod, spec: Pod, version: tuple[int, int]) -> str | None:
    pod_bad = ((spec.get("securityContext") or {}).get("seccompProfile") or {}).get("type") == "Unconfined"
    names = [c["name"] for c in _containers(spec)
             if (_context(c).get("seccompProfile") or {}).get("type") == "Unconfined"]
    if not (pod_bad or names):
        return None
    return (f"seccompProfile ({_setters(pod_bad, names)} must not set securityContext.seccompProfile.type "
            'to "Unconfined")')


def _sysctls(meta: Pod, spec: Pod, version: tuple[int, int]) -> str | None:
    safe = frozenset().union(*(names for since, names in SAFE_SYSCTLS.items() if since <= version))
    forbidden = [s["name"] for s in (spec.get("securityContext") or {}).get("sysctls") or [] if s["name"] not in safe]
    return f"forbidden sysctls ({', '.join(forbidden)})" if forbidden else None


def _windows_host_process(meta: Pod, spec: Pod, version: tuple[int, int]) -> str | None:
    pod_bad = ((spec.get("securityContext") or {}).get("windowsOptions") or {}).get("hostProcess") is True
    names = [c["name"] for c in _containers(spec)
             if (_context(c).get("windowsOptions") or {}).get("hostProcess") is True]
    if not (pod_bad or names):
        return None
    return f"hostProcess ({_setters(pod_bad, names)} must not set securityContext.windowsOptions.hostProcess=true)"


# ----------------------------------------------------------------------------- restricted
def _allow_privilege_escalation(meta: Pod, spec: Pod, version: tuple[int, int]) -> str | None:
    if _windows(spec):
        return None
    names = [c["name"] for c in _containers(spec) if _context(c).get("allowPrivilegeEscalation") is not False]
    return (f"allowPrivilegeEscalation != false ({_who(names)} must set "
            "securityContext.allowPrivilegeEscalation=false)") if names else None


def _capabilities_restricted(meta: Pod, spec: Pod, version: tuple[int, int]) -> str | None:
    if _windows(spec):
        return None
    missing = [c["name"] for c in _containers(spec)
               if "ALL" not in ((_context(c).get("capabilities") or {}).get("drop") or [])]
    extra = {c["name"]: sorted(set((_context(c).get("capabilities") or {}).get("add") or []) - {"NET_BIND_SERVICE"})
             for c in _containers(spec)}
    adding = [name for name, caps in extra.items() if caps]
    details = [f'{_who(missing)} must set securityContext.capabilities.drop=["ALL"]'] if missing else []
    if adding:
        caps = sorted({cap for name in adding for cap in extra[name]})
        details.append(f"{_who(adding)} must not include " + ", ".join(f'"{c}"' for c in caps)
                       + " in securityContext.capabilities.add")
    return f"unrestricted capabilities ({'; '.join(details)})" if details else None


def _restricted_volumes(meta: Pod, spec: Pod, version: tuple[int, int]) -> str | None:
    bad = {v["name"]: sorted(set(v) - {"name"} - RESTRICTED_VOLUMES) for v in spec.get("volumes", [])}
    names = [name for name, kinds in bad.items() if kinds]
    if not names:
        return None
    kinds = sorted({kind for name in names for kind in bad[name]})
    return (f"restricted volume types ({_who(names, 'volume')} use{'s' if len(names) == 1 else ''} restricted volume "
            f"type{'s' if len(kinds) > 1 else ''} " + ", ".join(f'"{k}"' for k in kinds) + ")")


def _run_as_non_root(meta: Pod, spec: Pod, version: tuple[int, int]) -> str | None:
    pod_value = (spec.get("securityContext") or {}).get("runAsNonRoot")
    explicit = [c["name"] for c in _containers(spec) if _context(c).get("runAsNonRoot") is False]
    if pod_value is False or explicit:
        return (f"runAsNonRoot != true ({_setters(pod_value is False, explicit)} must not set "
                "securityContext.runAsNonRoot=false)")
    implicit = [] if pod_value is True else [c["name"] for c in _containers(spec) if "runAsNonRoot" not in _context(c)]
    return (f"runAsNonRoot != true (pod or {_who(implicit)} must set securityContext.runAsNonRoot=true)"
            if implicit else None)


def _run_as_user(meta: Pod, spec: Pod, version: tuple[int, int]) -> str | None:
    pod_bad = (spec.get("securityContext") or {}).get("runAsUser") == 0
    names = [c["name"] for c in _containers(spec) if _context(c).get("runAsUser") == 0]
    return f"runAsUser=0 ({_setters(pod_bad, names)} must not set runAsUser=0)" if pod_bad or names else None


def _seccomp_restricted(meta: Pod, spec: Pod, version: tuple[int, int]) -> str | None:
    if _windows(spec):
        return None
    allowed = ("RuntimeDefault", "Localhost")
    pod_type = ((spec.get("securityContext") or {}).get("seccompProfile") or {}).get("type")
    pod_bad = pod_type is not None and pod_type not in allowed
    types = {c["name"]: (_context(c).get("seccompProfile") or {}).get("type") for c in _containers(spec)}
    explicit = [name for name, kind in types.items() if kind is not None and kind not in allowed]
    if pod_bad or explicit:
        values = sorted({kind for kind in [pod_type if pod_bad else None, *(types[n] for n in explicit)] if kind})
        return (f"seccompProfile ({_setters(pod_bad, explicit)} must not set securityContext.seccompProfile.type to "
                + ", ".join(f'"{v}"' for v in values) + ")")
    implicit = [] if pod_type in allowed else [name for name, kind in types.items() if kind is None]
    return (f'seccompProfile (pod or {_who(implicit)} must set securityContext.seccompProfile.type to '
            '"RuntimeDefault" or "Localhost")') if implicit else None


Check = Callable[[Pod, Pod, tuple[int, int]], "str | None"]
#: Each check by its upstream ID and level. Refusals are reported baseline checks first, then
#: restricted ones, each group in the order of its IDs (policy/registry.go).
BASELINE: dict[str, Check] = {
    "appArmorProfile": _app_armor, "capabilities_baseline": _capabilities_baseline,
    "hostNamespaces": _host_namespaces, "hostPathVolumes": _host_path_volumes, "hostPorts": _host_ports,
    "privileged": _privileged, "procMount": _proc_mount, "seLinuxOptions": _se_linux_options,
    "seccompProfile_baseline": _seccomp_baseline, "sysctls": _sysctls, "windowsHostProcess": _windows_host_process}
RESTRICTED: dict[str, Check] = {
    "allowPrivilegeEscalation": _allow_privilege_escalation, "capabilities_restricted": _capabilities_restricted,
    "restrictedVolumes": _restricted_volumes, "runAsNonRoot": _run_as_non_root, "runAsUser": _run_as_user,
    "seccompProfile_restricted": _seccomp_restricted}
#: The baseline checks a restricted one replaces (its stricter form).
OVERRIDDEN = {"capabilities_baseline", "hostPathVolumes", "seccompProfile_baseline"}


def pod_security_violations(pod: Pod, level: str, version: tuple[int, int] = LATEST) -> list[str]:
    """What Pod Security admission refuses in ``pod`` at ``level`` (the policy of ``version``)."""
    if level not in LEVELS:
        raise ValueError(f"level {level!r} is not one of {LEVELS}")
    checks = dict(sorted(BASELINE.items()))
    if level == "restricted":
        checks = {name: check for name, check in checks.items() if name not in OVERRIDDEN}
        checks.update(sorted(RESTRICTED.items()))
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    return [found for check in checks.values() if (found := check(meta, spec, version)) is not None]
