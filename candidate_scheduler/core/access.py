"""Who is asking, and what they may do: principals, roles and the rights table.

Every message the scheduler takes comes from a *principal*: the holder of an authorised CURVE key (the
native sockets) or of a bearer token (the openpi websocket), named in the key directory
(service/keys.py writes and reads it). A principal names its tenant, whose limits and fair share
apply to what it submits (core/tenants.py). On loopback without keys everyone is `LOCAL`, an admin:
the machine's own users are trusted, as before keys existed.

Roles:
- client: submits groups, and cancels and queries the groups it submitted;
- proxy: a front that acts for many clients (the openpi websocket, the sglang bridge): a client, which
  may also submit *on behalf of* a client it authenticated itself (its token), whose tenant then applies,
  and read stats (the model's capability, for its metadata);
- admin: everything, including stats, drain and shutdown and other principals' groups;
- worker: the worker link only (the ZAP domain keeps workers off the client sockets and clients off it).

The rights are one table and one pure function, so the shell applies decisions it never makes.
"""

from __future__ import annotations

import enum
import re

from candidate_scheduler.core.values import value

FORBIDDEN = "forbidden"
DEFAULT_TENANT = "default"
MAX_NAME_CHARS = 64
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class Role(str, enum.Enum):
    CLIENT = "client"
    PROXY = "proxy"
    ADMIN = "admin"
    WORKER = "worker"


class Action(str, enum.Enum):
    SUBMIT = "submit"
    CANCEL = "cancel"
    STATUS = "status"
    STATS = "stats"
    DRAIN = "drain"
    SHUTDOWN = "shutdown"
    COMPAT_REPORT = "compat_report"
    WORKER_LEAVE = "worker_leave"


def check_name(kind: str, name: str) -> str:
    """Principal and tenant names: short, printable, safe as a file name and a metric label."""
    # fullmatch: `$` also matches before a trailing newline, and "rl\n" written into a key file reads back as "rl"
    if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME_CHARS or not _NAME.fullmatch(name):
        raise ValueError(f"{kind} name must be 1-{MAX_NAME_CHARS} characters of [A-Za-z0-9_.-], "
                         f"starting with a letter or digit; got {name!r}")
    return name


@value
class Principal:
    name: str
    tenant: str = DEFAULT_TENANT
    role: Role = Role.CLIENT

    def __post_init__(self) -> None:
        check_name("principal", self.name)
        check_name("tenant", self.tenant)
        object.__setattr__(self, "role", Role(self.role))


LOCAL = Principal("local", DEFAULT_TENANT, Role.ADMIN)  # loopback without keys: the machine's own users

_CLIENT_ACTIONS = frozenset({Action.SUBMIT, Action.CANCEL, Action.STATUS})
RIGHTS: dict[Role, frozenset[Action]] = {
    Role.CLIENT: _CLIENT_ACTIONS,
    # a front reads stats for the model's capability (its metadata) and reports its own counts
    Role.PROXY: _CLIENT_ACTIONS | {Action.STATS, Action.COMPAT_REPORT},
    Role.ADMIN: frozenset(Action),
    Role.WORKER: frozenset(),
}
_OWN_GROUP_ACTIONS = frozenset({Action.CANCEL, Action.STATUS})


def denied(principal: Principal, action: Action, owners: tuple[str, ...] | None = None) -> str | None:
    """Why `principal` may not do `action` (None: it may). `owners`: the principals a group belongs to
    (its submitter and, for a proxy's group, the client it acted for); None for a group nobody owns
    here (unknown, or forgotten), which reveals nothing and so is anyone's to ask about."""
    if action not in RIGHTS[principal.role]:
        return f"{principal.name} ({principal.role.value}) may not {action.value}"
    if action in _OWN_GROUP_ACTIONS and principal.role is not Role.ADMIN and owners is not None \
            and principal.name not in owners:
        return f"{principal.name} may {action.value} only the groups it submitted"
    return None


def acting_for(principal: Principal, on_behalf: str | None, directory) -> tuple[Principal, str | None]:
    """The principal a submission counts against, and why not (an error) when it may not act so.
    `directory(name) -> Principal | None` looks up the clients a proxy may act for (the holders of
    tokens, which a front checks itself); only a client may be acted for."""
    if on_behalf is None or on_behalf == principal.name:
        return principal, None
    if principal.role not in (Role.PROXY, Role.ADMIN):
        return principal, f"{principal.name} ({principal.role.value}) may not submit on behalf of another"
    target = directory(on_behalf)
    if target is None or target.role is not Role.CLIENT:  # a leaked proxy key cannot act as an admin
        return principal, f"no client named {on_behalf!r} to act for"
    return target, None
