"""The key directory: who may talk to the scheduler, as files (`candidate-scheduler keys` writes them).

```
DIR/server.key, server.key_secret     the scheduler's CURVE pair; everyone who connects needs server.key
DIR/NAME.key, NAME.key_secret         NAME's CURVE pair: hand NAME.key_secret and server.key to NAME
DIR/authorized_clients/NAME.key       NAME's public key, with its role and tenant as metadata
DIR/NAME.token                        NAME's bearer token (openpi websocket, HTTP): hand it to NAME
DIR/authorized_tokens/NAME.json       the token's SHA-256, role and tenant (the token itself is not kept)
```

`keys DIR` with no names writes the scheduler's pair, a worker pair named `worker` (the name the worker
looks for: `worker --curve-dir DIR`) and an `admin` pair, each only if missing. A public key with no
role metadata is a worker's (what `keys` wrote before roles existed). Until 2026-12-06 the worker pair
was named `client`, which invited handing it to a robot (a worker key receives every tenant's
observations); a directory that holds it is still read as before (`worker_key_name`).

`keys` writes nothing other users may write, whatever the umask, nor into a directory another user
owns, and `Directory.load` refuses a directory or record every user may write or another user (not
root) owns (off a read-only mount): they could authorise themselves.

`Directory.load(DIR)` reads the authorised keys and tokens into principals (core/access.py); the
scheduler's ZAP handler (`Authenticator`) admits a CURVE key on a socket's domain only if its role
belongs there, and names the connection by its principal, which the shell reads back per message
(ZMQ's `User-Id` property).
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import stat
from dataclasses import dataclass, field
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils import z85

from candidate_scheduler.core.access import DEFAULT_TENANT, Principal, Role, check_name

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
SERVER = "server"
WORKER_KEY = "worker"  # the worker's pair: what `worker --curve-dir DIR` reads (worker_key_name)
LEGACY_WORKER_KEY = "client"  # its name in directories written before 2026-12-06
ADMIN_KEY = "admin"
OPENPI_FRONT, SGLANG_BRIDGE = "openpi-front", "sglang-bridge"  # serve authorises its fronts as these (commands._serve)
FRONT_NAMES = (OPENPI_FRONT, SGLANG_BRIDGE)
CLIENTS_DOMAIN = "clients"  # the request and control sockets
WORKERS_DOMAIN = "workers"  # the worker link


class KeyDirError(ValueError):
    """A key directory that cannot be used as it is (missing or malformed file): one line says which."""


def _dir(key_dir: str | os.PathLike) -> Path:
    # "~/keys" from Python (docs/deployment.md): the shell expands it on a command line, Python does not
    return Path(key_dir).expanduser()


def _write_public(path: Path, public: bytes, metadata: dict[str, str]) -> None:
    # pyzmq writes metadata only into the secret file; the scheduler reads the public one
    lines = [f"#   ZeroMQ CURVE public certificate, written {datetime.datetime.now():%Y-%m-%d %H:%M:%S} "
             "by candidate-scheduler keys", "metadata"]
    lines += [f'    {k} = "{v}"' for k, v in metadata.items()]
    lines += ["curve", f'    public-key = "{public.decode("ascii")}"', ""]
    path.write_text("\n".join(lines))


def _metadata(path: Path) -> dict[str, str]:
    out, section = {}, None
    for raw in path.read_text(encoding="utf8").splitlines():
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        if not raw.startswith((" ", "\t")):
            section = raw.strip()
        elif section == "metadata" and "=" in raw:
            k, v = raw.split("=", 1)
            out[k.strip()] = v.strip().strip('"')
    return out


def _key_record(path: Path) -> Principal:
    """Who an authorised key's record (authorized_clients/NAME.key) says its holder is."""
    meta = _metadata(path)
    return Principal(check_name("principal", path.stem), meta.get("tenant", DEFAULT_TENANT),
                     Role(meta.get("role", Role.WORKER.value)))


def _token_record(path: Path) -> tuple[Principal, str]:
    """Who an authorised token's record (authorized_tokens/NAME.json) says its holder is, and the
    token's SHA-256."""
    rec = json.loads(path.read_text(encoding="utf8"))
    if not isinstance(rec, dict):
        raise ValueError("not a JSON object")
    principal = Principal(check_name("principal", path.stem), rec.get("tenant", DEFAULT_TENANT),
                          Role(rec.get("role", Role.CLIENT.value)))
    digest = rec.get("sha256")
    if not isinstance(digest, str) or not _SHA256.fullmatch(digest):  # `$` lets "...\n" through
        raise ValueError("sha256 must be 64 hex digits")
    return principal, digest


def _authorised(d: Path, name: str) -> tuple[Principal | None, str]:
    """The principal `name` is authorised as in the directory now (its key's or its token's record),
    and the file that says so; (None, "") when it is not."""
    key, token = d / "authorized_clients" / f"{name}.key", d / "authorized_tokens" / f"{name}.json"
    try:
        if key.exists():
            return _key_record(key), str(key)
        if token.exists():
            return _token_record(token)[0], str(token)
    except (OSError, ValueError, TypeError) as exc:
        raise KeyDirError(f"cannot read how {name!r} is authorised now: {exc}") from exc
    return None, ""


def _check_new(d: Path, principal: Principal) -> None:
    """Refuse what would leave a directory the scheduler cannot load (Directory.add: one name, one role
    and tenant) or cannot start with (serve authorises its fronts by these names at run time)."""
    if principal.name in FRONT_NAMES:
        raise KeyDirError(f"{principal.name!r} is the name serve gives one of its own fronts; choose another")
    known, where = _authorised(d, principal.name)
    if known is not None and known != principal:
        raise KeyDirError(f"{principal.name!r} is authorised as {known.role.value} of tenant {known.tenant} "
                          f"({where}); a key and a token of one name must agree: use that role and tenant, "
                          "or another name")


def add_key(key_dir: str | os.PathLike, name: str, role: Role | str = Role.CLIENT,
            tenant: str = DEFAULT_TENANT) -> Path:
    """A new CURVE pair for `name`, authorised with its role and tenant; refuses to overwrite one."""
    with _umask(_SHARED):
        return _add_key(_dir(key_dir), name, role, tenant)


def _add_key(d: Path, name: str, role: Role | str, tenant: str) -> Path:
    principal = Principal(check_name("principal", name), tenant, Role(role))
    if d.exists():
        _check_others_cannot_write(d)
    # the authorised public key counts too: a secret handed out (moved off this host) leaves only it, and
    # writing a new pair over it would revoke the key its holder has
    for path in (d / f"{name}.key_secret", d / "authorized_clients" / f"{name}.key"):
        if os.path.lexists(path):
            raise KeyDirError(f"{path} exists; remove {name}.key_secret and authorized_clients/{name}.key "
                              "first to replace the key")
    _check_new(d, principal)
    (d / "authorized_clients").mkdir(parents=True, exist_ok=True)
    with _umask(_PRIVATE):
        _public_file, secret_file = zmq.auth.create_certificates(str(d), name)
    public, _ = zmq.auth.load_certificate(secret_file)
    _write_public(d / "authorized_clients" / f"{name}.key", public,
                  {"role": principal.role.value, "tenant": principal.tenant})
    return Path(secret_file)


def add_token(key_dir: str | os.PathLike, name: str, role: Role | str = Role.CLIENT,
              tenant: str = DEFAULT_TENANT) -> str:
    """A new bearer token for `name`: written to DIR/NAME.token (0600), its hash authorised."""
    with _umask(_SHARED):
        return _add_token(_dir(key_dir), name, role, tenant)


def _add_token(d: Path, name: str, role: Role | str, tenant: str) -> str:
    principal = Principal(check_name("principal", name), tenant, Role(role))
    if principal.role is Role.WORKER:
        raise KeyDirError("a worker connects with a CURVE key, not a token")
    if d.exists():
        _check_others_cannot_write(d)
    for path in (d / f"{name}.token", d / "authorized_tokens" / f"{name}.json"):
        if os.path.lexists(path):  # the record alone: a token handed out, which a new one would revoke
            raise KeyDirError(f"{path} exists; remove {name}.token and authorized_tokens/{name}.json first "
                              "to replace the token")
    _check_new(d, principal)
    (d / "authorized_tokens").mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    fd = os.open(d / f"{name}.token", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    record = {"sha256": _digest(token), "role": principal.role.value, "tenant": principal.tenant}
    (d / "authorized_tokens" / f"{name}.json").write_text(json.dumps(record, indent=2) + "\n")
    return token


def init_dir(key_dir: str | os.PathLike) -> list[str]:
    """The scheduler's pair, a worker pair and an admin pair, each only if missing; what it wrote."""
    with _umask(_SHARED):
        return _init_dir(_dir(key_dir))


def _init_dir(d: Path) -> list[str]:
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise KeyDirError(f"cannot make the key directory {d}: {exc}") from exc
    _check_others_cannot_write(d)  # another user's: what it holds could be links planted for us to write through
    wrote = []
    if not os.path.lexists(d / "server.key_secret"):
        if os.path.lexists(d / "server.key"):  # a client's or worker's copy: a new pair would lock it out
            raise KeyDirError(f"{d / 'server.key'} exists without server.key_secret: this is a copy handed to a "
                              "client or worker, not the scheduler's directory; run `keys` on that one")
        with _umask(_PRIVATE):
            zmq.auth.create_certificates(str(d), SERVER)
        wrote.append(f"{d}/server.key[_secret]")
    for name, role in ((WORKER_KEY, Role.WORKER), (ADMIN_KEY, Role.ADMIN)):
        # present once authorised: a secret moved to the hosts that use it is not missing; an older
        # directory's worker pair goes by its old name
        names = (name, LEGACY_WORKER_KEY) if name == WORKER_KEY else (name,)
        if not any(os.path.lexists(p) for n in names
                   for p in (d / f"{n}.key_secret", d / "authorized_clients" / f"{n}.key")):
            add_key(d, name, role)
            wrote.append(f"{d}/{name}.key[_secret] ({role.value})")
    return wrote


def worker_key_name(key_dir: str | os.PathLike) -> str:
    """The name of the worker pair a worker's key directory holds: `worker`, or `client` in a copy made
    before 2026-12-06 (when it holds no `worker.key_secret`)."""
    d = Path(key_dir).expanduser()
    if not (d / f"{WORKER_KEY}.key_secret").exists() and (d / f"{LEGACY_WORKER_KEY}.key_secret").exists():
        return LEGACY_WORKER_KEY
    return WORKER_KEY


# Bits masked off whatever the caller's umask: nobody else may write the directories and the records
# (whoever may, can authorise keys and tokens of their own), nor read a secret. pyzmq writes a secret key
# with plain open(): under _PRIVATE it is 0600 from its first byte, not world-readable until a chmod.
_SHARED, _PRIVATE = 0o022, 0o077


@contextlib.contextmanager
def _umask(bits: int):
    old = os.umask(_current_umask() | bits)
    try:
        yield
    finally:
        os.umask(old)


def _current_umask() -> int:
    """The process's umask, read without changing it where Linux says it (/proc, since 4.7): setting it to
    read it would give a file another thread creates meanwhile mode 000."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    old = os.umask(0o077)  # elsewhere it can only be read by setting it: a strict one meanwhile
    os.umask(old)
    return old


def _check_others_cannot_write(path: Path) -> None:
    """Refuse a key directory, or a record in it, that another user may write: one every user or its group
    may write (a sticky directory too: they add new files), or one another user owns (an attacker's `mkdir
    /tmp/keys` before the operator's `keys /tmp/keys`: mode 0755 hides nothing from its owner). Anyone
    who can write it could authorise an admin key or a token of their own there. Root's are this user's
    to trust. A read-only mount is exempt: a Kubernetes secret volume shows 1777 modes nobody can use."""
    try:
        st = path.stat()
        if os.statvfs(path).f_flag & os.ST_RDONLY:
            return
    except OSError as exc:
        raise KeyDirError(f"{path}: {exc}") from exc
    if st.st_mode & stat.S_IWOTH:
        raise KeyDirError(f"{path} is writable by every user (mode {stat.S_IMODE(st.st_mode):o}): anyone on this "
                          f"host could authorise a key or a token of their own; `chmod o-w {path}`")
    if st.st_mode & stat.S_IWGRP:  # as sshd's StrictModes: a group's members are other users too
        raise KeyDirError(f"{path} is writable by its group (gid {st.st_gid}, mode {stat.S_IMODE(st.st_mode):o}): "
                          f"its members could authorise a key or a token of their own; `chmod g-w {path}`")
    me = os.geteuid()
    if st.st_uid not in (me, 0):
        raise KeyDirError(f"{path} is owned by uid {st.st_uid}, not by this user (uid {me}) or root: its owner "
                          "could authorise a key or a token of their own; use a directory of yours, or `chown` it")


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf8")).hexdigest()


def read_token(path: str | os.PathLike) -> str:
    return Path(path).expanduser().read_text(encoding="utf8").strip()


@dataclass
class Directory:
    """The principals of a key directory, by name, by public key (z85) and by token digest."""

    by_name: dict[str, Principal] = field(default_factory=dict)
    by_key: dict[bytes, Principal] = field(default_factory=dict)  # z85-encoded, as pyzmq loads them
    by_token: dict[str, Principal] = field(default_factory=dict)

    @classmethod
    def load(cls, key_dir: str | os.PathLike) -> Directory:
        d, out = _dir(key_dir), cls()
        for path in (d, d / "authorized_clients", d / "authorized_tokens"):
            if path.exists():
                _check_others_cannot_write(path)
        for path in sorted((d / "authorized_clients").glob("*.key")):
            _check_others_cannot_write(path)
            try:
                public, _ = zmq.auth.load_certificate(str(path))
                principal = _key_record(path)
            except (OSError, ValueError) as exc:
                raise KeyDirError(f"{path}: {exc}") from exc
            out.add(principal, key=public)
        for path in sorted((d / "authorized_tokens").glob("*.json")):
            _check_others_cannot_write(path)
            try:
                principal, digest = _token_record(path)
            except (OSError, ValueError, TypeError) as exc:
                raise KeyDirError(f"{path}: {exc}") from exc
            out.add(principal, digest=digest)
        return out

    def add(self, principal: Principal, key: bytes | None = None, digest: str | None = None) -> None:
        known = self.by_name.get(principal.name)
        if known is not None and known != principal:
            raise KeyDirError(f"{principal.name!r} is authorised twice with different roles or tenants")
        # One key, one principal: a public key authorised under two names (a record copied to authorise
        # the same holder again) would be whichever name loaded last, its role included.
        if key is not None and self.by_key.get(key, principal) != principal:
            raise KeyDirError(f"one public key is authorised as both {self.by_key[key].name!r} and "
                              f"{principal.name!r}; remove one of the two authorized_clients/ records")
        if digest is not None and self.by_token.get(digest, principal) != principal:
            raise KeyDirError(f"one token is authorised as both {self.by_token[digest].name!r} and "
                              f"{principal.name!r}; remove one of the two authorized_tokens/ records")
        self.by_name[principal.name] = principal
        if key is not None:
            self.by_key[key] = principal
        if digest is not None:
            self.by_token[digest] = principal

    def get(self, name: str) -> Principal | None:
        return self.by_name.get(name)

    def token_holder(self, name: str) -> Principal | None:
        """The principal `name` if it holds a token: whom a front, which checks tokens, may act for."""
        principal = self.by_name.get(name)
        return principal if principal is not None and principal in self.by_token.values() else None

    def for_token(self, token: str | None) -> Principal | None:
        """The principal of a bearer token (compared by digest, in constant time per entry)."""
        if not token:
            return None
        digest = _digest(token)
        for known, principal in self.by_token.items():
            if hmac.compare_digest(known, digest):
                return principal
        return None

    def tenants(self) -> list[str]:
        return sorted({p.tenant for p in self.by_name.values()})


class Authenticator(ThreadAuthenticator):
    """ZAP for the scheduler's sockets: a key is admitted on a domain only if its role belongs there,
    and the connection is named by its principal (the shell reads it back as `User-Id`)."""

    def __init__(self, ctx: zmq.Context, directory: Directory):
        super().__init__(ctx)
        self.directory = directory
        self.principals = dict(directory.by_key)  # z85 public key -> principal

    def admit(self, principal: Principal, public_z85: bytes) -> None:
        """Authorise a key made at run time (a front this process started): in memory only."""
        self.directory.add(principal, key=public_z85)
        self.principals[public_z85] = principal

    def start_for_domains(self) -> None:
        self.start()
        for domain in (CLIENTS_DOMAIN, WORKERS_DOMAIN):
            self.configure_curve_callback(domain, _Check(self, domain))

    def curve_user_id(self, client_public_key: bytes) -> str:
        principal = self.principals.get(z85.encode(client_public_key))
        return principal.name if principal is not None else ""


class _Check:
    def __init__(self, auth: Authenticator, domain: str):
        self.auth, self.domain = auth, domain

    def callback(self, domain: str, key: bytes) -> bool:
        principal = self.auth.principals.get(key)
        if principal is None:
            return False
        return (principal.role is Role.WORKER) == (self.domain == WORKERS_DOMAIN)


@dataclass(frozen=True)
class ClientKeys:
    """What a client needs to reach a CURVE-protected scheduler: the server's public key and its pair."""

    server_public: bytes
    public: bytes
    secret: bytes = field(repr=False)  # a repr lands in logs, tracebacks and test reports

    @classmethod
    def load(cls, key_dir: str | os.PathLike, name: str = ADMIN_KEY) -> ClientKeys:
        d = _dir(key_dir)
        try:
            server_public, _ = zmq.auth.load_certificate(str(d / "server.key"))
            public, secret = zmq.auth.load_certificate(str(d / f"{name}.key_secret"))
        except (OSError, ValueError) as exc:
            raise KeyDirError(f"cannot read the keys of {name!r} in {d} (server.key and {name}.key_secret): {exc}") from exc
        if secret is None:
            raise KeyDirError(f"{d / (name + '.key_secret')} holds no secret key")
        return cls(server_public, public, secret)

    @classmethod
    def ephemeral(cls, server_public: bytes) -> ClientKeys:
        public, secret = zmq.curve_keypair()
        return cls(server_public, public, secret)

    def apply(self, sock: zmq.Socket) -> None:
        sock.curve_serverkey = self.server_public
        sock.curve_publickey = self.public
        sock.curve_secretkey = self.secret

    def to_env(self) -> str:
        return ",".join(k.decode("ascii") for k in (self.server_public, self.public, self.secret))  # no "," in Z85

    @classmethod
    def from_env(cls, text: str) -> ClientKeys:
        server_public, public, secret = (part.encode("ascii") for part in text.split(","))
        return cls(server_public, public, secret)


# ---- bearer tokens on the websocket and HTTP fronts ---------------------------------------------------

AUTH_SCHEMES = ("bearer", "api-key")  # openpi-client sends its api_key as "Api-Key <key>"


def bearer_token(authorization: list[str]) -> tuple[str | None, str]:
    """The token of the `Authorization` header values of a request, or None and why not (one line,
    never echoing what was sent)."""
    if not authorization:
        return None, "no Authorization header: send 'Authorization: Bearer <token>'"
    if len(authorization) > 1:
        return None, "more than one Authorization header"
    scheme, _, token = authorization[0].strip().partition(" ")
    if scheme.lower() not in AUTH_SCHEMES or not token.strip():
        return None, "the Authorization header must be 'Bearer <token>' or 'Api-Key <token>'"
    return token.strip(), ""


def authenticate(tokens: Directory, authorization: list[str]) -> tuple[Principal | None, str]:
    """The principal whose token the header carries (`Directory.for_token`: by digest, in constant
    time per entry), or None and why not."""
    token, why = bearer_token(authorization)
    if token is None:
        return None, why
    principal = tokens.for_token(token)
    return (principal, "") if principal is not None else (None, "unknown or revoked token")


CREDENTIAL_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie"})


class RedactCredentials(logging.Filter):
    """Keeps a credential header's value out of a log record. The websockets library (the openpi front's
    server, uvicorn's websocket protocol under sglang's HTTP server) logs each handshake header at DEBUG
    as ``("< %s: %s", name, value)``: a debug log would otherwise hold every robot's bearer token."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if (isinstance(args, tuple) and len(args) == 2 and isinstance(args[0], str)
                and args[0].lower() in CREDENTIAL_HEADERS):
            record.args = (args[0], "[redacted]")
        return True


def redact_credentials_in(*logger_names: str) -> None:
    """`RedactCredentials` on these loggers (idempotent). A logger's filters see only what is logged on
    it by name, so each logger that logs headers is named."""
    for name in logger_names:
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactCredentials) for f in logger.filters):
            logger.addFilter(RedactCredentials())


def load_tokens(key_dir: str) -> Directory:
    """The key directory whose `authorized_tokens/` a front requires; KeyDirError (one line) when it
    is not a directory or a record is malformed. A directory without tokens loads (every connection is
    then refused until one is added and the front restarted; `Directory.by_token` is empty)."""
    if not _dir(key_dir).is_dir():
        raise KeyDirError(f"--tokens {key_dir}: no such directory (`candidate-scheduler keys {key_dir} "
                          "--token NAME` writes one)")
    return Directory.load(key_dir)


ENV_KEYS = "CANDIDATE_SCHEDULER_CLIENT_KEYS"  # how serve hands a front it starts its run-time pair
