"""`python -m trainer credentials serve|prolog|epilog`: each Slurm job gets cloud credentials of its own, never the
node's (the metadata service answers only root: ami/files/gpufleet-imds-root-only.sh).

Three parts, the way AWS hands credentials to containers (ECS task roles, EKS Pod Identity):

- Slurm's Prolog (``prolog``, root, before a job's first task on a node) grants the job: it writes the grant
  (``grants/<slurm id>.json``, root only: the gpufleet job, the digest of a fresh token) and the token
  (``tokens/<slurm id>``, the job's uid, 0400) in a directory only root writes. Which gpufleet job a Slurm job
  is comes from Slurm and the bucket, never from the job: the batch script the team's user submitted under the
  team's account (the bridge submits as it: trainer.slurm.users) names it (trainer.slurm.batch.job_id_of), and
  the job's record must name this Slurm job (the bridge writes it after sbatch). Anything else, a user's own
  sbatch script or a job's script claiming another job, is the bridge's mirror job ``slurm-<id>``
  (trainer.slurm.bridge.MIRROR_PREFIX) and gets that prefix.
- the daemon (``serve``, root, loopback only) answers ``GET /v1/credentials`` with ``Authorization: <token>``:
  the job's credentials from the cloud's issuer (the stack's job role through the cloud's STS with a policy
  narrowing it to the job: AWS, trainer.clouds.aws_credentials; Tencent Cloud, the same document shape holding a
  CAM temporary key, trainer.clouds.tencent_credentials), cached and renewed before they expire. A token is
  ``<slurm id>.<43 random characters>``; one unknown, removed or not matching its grant gets 403.
- Slurm's TaskProlog (ami/files/gpufleet-task-prolog.sh) gives each task AWS_CONTAINER_CREDENTIALS_FULL_URI and
  AWS_CONTAINER_AUTHORIZATION_TOKEN, which every AWS SDK reads (and the trainer's Tencent provider, and boto3
  against COS's S3 API), and unsets static keys; the Epilog
  (``epilog``) removes the grant, so the token is dead once the job leaves the node.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import threading
import time
import urllib.parse
from dataclasses import dataclass
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable

from trainer.clouds import adapter
from trainer.errors import ArgumentParser, UsageError
from trainer.jobs.layout import team_of_account
from trainer.jobs.records import RecordStore
from trainer.node import node_schema
from trainer.slurm import batch, users
from trainer.slurm import client as default_client
from trainer.slurm.bridge import MIRROR_PREFIX

log = logging.getLogger("gpufleet.credentials")

DIR = "/run/gpufleet/credentials"
INSTANCE = f"{DIR}/instance.json"  # the instance's id and type, for jobs (serve writes it; 0644)
HOST, PORT, PATH = "127.0.0.1", 51680, "/v1/credentials"
# Azure: the App Service managed-identity protocol, which azure-identity (and MSAL) speak where IDENTITY_ENDPOINT and
# IDENTITY_HEADER are set: GET <endpoint>?api-version=2019-08-01&resource=R with X-IDENTITY-HEADER: <token>
AZURE_PATH, AZURE_API, AZURE_HEADER = "/msi/token", "2019-08-01", "X-IDENTITY-HEADER"
SECRET_PATH = "/v1/secret"  # Azure: a Key Vault secret of the job's team, read for it by the node (?name=N)
TOKEN = re.compile(r"([0-9]+)\.[A-Za-z0-9_-]{43}")
SLURM_ID = re.compile(r"[0-9]+")
RENEW_BEFORE_S = 20 * 60   # botocore asks again 15 minutes before expiry: hand out nothing closer to it
RECORD_WAIT_S = 30.0        # how long the Prolog waits for the bridge to name the Slurm job in the record

# (team, job id, session name[, resource: Azure]) -> (credentials document, expiry)
Issuer = Callable[..., "tuple[dict, float]"]


class Denied(Exception):
    def __init__(self, status: int, why: str):
        super().__init__(why)
        self.status = status


@dataclass(frozen=True)
class Grant:
    slurm_id: str
    team: str
    job_id: str
    uid: int
    digest: str


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _private_dir(path: Path, mode: int) -> Path:
    """A directory of root's, never a link: made if missing, its mode set."""
    path.mkdir(parents=True, exist_ok=True)
    if path.is_symlink() or not path.is_dir():
        raise UsageError(f"credentials: {path} is not a directory")
    os.chmod(path, mode, follow_symlinks=False)
    return path


def _write_new(path: Path, data: bytes, mode: int, owner: tuple[int, int] | None = None) -> None:
    """Written whole under a fresh name and moved in place: nothing is followed, nothing half-written seen."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        os.write(fd, data)
        if owner is not None and os.geteuid() == 0:
            os.fchown(fd, *owner)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def write_grant(directory: Path, slurm_id: str, team: str, job_id: str, uid: int, gid: int) -> str:
    """The grant of a Slurm job on this node and its token file (readable by the job's user only)."""
    if not SLURM_ID.fullmatch(slurm_id):
        raise UsageError(f"credentials: Slurm job id {slurm_id!r}: expected digits")
    directory = Path(directory)
    _private_dir(directory, 0o755)
    token = f"{slurm_id}.{secrets.token_urlsafe(32)}"
    grant = {"slurm_id": slurm_id, "team": team, "job_id": job_id, "uid": uid, "digest": digest(token)}
    _write_new(_private_dir(directory / "grants", 0o700) / f"{slurm_id}.json", json.dumps(grant).encode(), 0o600)
    _write_new(_private_dir(directory / "tokens", 0o711) / slurm_id, token.encode(), 0o400, (uid, gid))
    return token


def read_grant(directory: Path, slurm_id: str) -> Grant | None:
    try:
        fd = os.open(Path(directory) / "grants" / f"{slurm_id}.json", os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd) as f:
        raw = json.load(f)
    return Grant(str(raw["slurm_id"]), str(raw["team"]), str(raw["job_id"]), int(raw["uid"]), str(raw["digest"]))


def remove_grant(directory: Path, slurm_id: str) -> None:
    if SLURM_ID.fullmatch(slurm_id):
        for path in (Path(directory) / "grants" / f"{slurm_id}.json", Path(directory) / "tokens" / slurm_id):
            path.unlink(missing_ok=True)


class Broker:
    """The credentials of granted jobs, one issue per job (and, on Azure, per resource) until it nears expiry.
    ``path``: where the endpoint answers (PATH; AZURE_PATH for an Azure issuer, which takes the resource)."""

    def __init__(self, directory: Path, issuer: Issuer, clock: Callable[[], float] = time.time, path: str = PATH):
        self.dir, self.issuer, self.clock, self.path = Path(directory), issuer, clock, path
        self._cache: dict[tuple, tuple[str, dict, float]] = {}  # (slurm id, resource) -> (digest, document, expiry)
        self._locks: dict[tuple, threading.Lock] = {}
        self._lock = threading.Lock()

    def grant_of(self, token: str) -> Grant:
        """The grant a job's token holds; Denied (401 not a token, 403 no such grant or another token)."""
        m = TOKEN.fullmatch(token or "")
        if m is None:
            raise Denied(401, "no token, or not a token")
        grant = read_grant(self.dir, m[1])
        if grant is None or not hmac.compare_digest(grant.digest, digest(token)):
            raise Denied(403, f"Slurm job {m[1]}: no such grant on this node, or another token")
        return grant

    def credentials(self, token: str, resource: str | None = None) -> dict:
        grant = self.grant_of(token)
        key = (grant.slurm_id, resource)
        with self._lock:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:  # a job's ranks asking at once: one issue
            cached = self._cache.get(key)
            if cached and cached[0] == grant.digest and cached[2] - self.clock() > RENEW_BEFORE_S:
                return cached[1]
            asked = (grant.team, grant.job_id, grant.slurm_id) + ((resource,) if resource is not None else ())
            document, expires = self.issuer(*asked)
            log.info("job %s of team %s (Slurm job %s): credentials%s until %s", grant.job_id, grant.team,
                     grant.slurm_id, f" for {resource}" if resource else "",
                     time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(expires)))
            with self._lock:
                now = self.clock()
                for k in [k for k, (_, _, exp) in self._cache.items() if exp <= now]:
                    self._cache.pop(k, None)
                    self._locks.pop(k, None)
                self._cache[key] = (grant.digest, document, expires)
            return document

    def secret(self, token: str, name: str) -> str:
        """A Key Vault secret for the job holding ``token``, read by the issuer with the node's identity (Azure:
        only its team's, ``<team>-...``; the issuer refuses the rest)."""
        grant = self.grant_of(token)
        reader = getattr(self.issuer, "secret", None)
        if reader is None:
            raise Denied(404, "this node's jobs read their secrets with their own credentials")
        value = reader(grant.team, name)
        log.info("job %s of team %s (Slurm job %s): secret %s read", grant.job_id, grant.team, grant.slurm_id, name)
        return value


def serve(broker: Broker, host: str = HOST, port: int = PORT) -> ThreadingHTTPServer:
    """The loopback endpoint (not started: ``serve_forever``, or a thread in tests)."""
    if host not in ("127.0.0.1", "::1", "localhost"):
        raise UsageError(f"credentials: --host {host}: the endpoint listens on loopback only")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            url = urllib.parse.urlsplit(self.path)
            query = dict(urllib.parse.parse_qsl(url.query))
            try:
                if url.path == broker.path == PATH and not url.query:
                    return self._answer(200, broker.credentials(self.headers.get("Authorization", "")))
                if url.path == broker.path == AZURE_PATH:
                    if query.get("api-version") != AZURE_API or not query.get("resource"):
                        raise Denied(400, f"expected api-version={AZURE_API} and a resource")
                    return self._answer(200, broker.credentials(self.headers.get(AZURE_HEADER, ""),
                                                                query["resource"]))
                if url.path == SECRET_PATH and broker.path == AZURE_PATH and query.get("name"):
                    value = broker.secret(self.headers.get(AZURE_HEADER, ""), query["name"])
                    return self._answer(200, {"value": value})
                return self._answer(404, {"message": f"not found; ask {broker.path}"})
            except Denied as exc:
                log.warning("credentials refused (%d): %s", exc.status, exc)
                return self._answer(exc.status, {"message": str(exc)})
            except Exception as exc:  # the issuer's fault (STS unreachable): one line, the job's SDK retries
                log.error("credentials not issued: %s: %s", type(exc).__name__, exc)
                return self._answer(502, {"message": "credentials could not be issued; see the node's log"})

        def _answer(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):  # one line per refusal above; no access log (it would hold nothing useful)
            pass

    return ThreadingHTTPServer((host, port), Handler)


# --- Slurm's Prolog and Epilog -------------------------------------------------------------------------------

def job_of(slurm_id: str, bridge_user: str | None, records_of: Callable[[str], RecordStore], slurm=None,
           wait_s: float = RECORD_WAIT_S, sleep: Callable[[float], None] = time.sleep) -> tuple[str, str]:
    """Which gpufleet job Slurm job ``slurm_id`` is, as (team, job id) (see the module's docstring);
    ``records_of``: a team's records. ``bridge_user``: who the bridge submits as (a box's own user); None: each
    team's jobs as the team's user (trainer.slurm.users), under the team's account only."""
    slurm = slurm or default_client
    job = slurm.job(slurm_id)
    if job is None:
        raise UsageError(f"credentials: Slurm job {slurm_id}: slurmctld does not know it")
    account_team = team_of_account(job.account)
    mirror = (account_team, f"{MIRROR_PREFIX}{job.id}")  # as the bridge mirrors it
    if job.user != (bridge_user or users.name_of(account_team)):
        return mirror
    script = slurm.batch_script(str(job.array_job_id or slurm_id))
    claimed = batch.job_id_of(script, job.array_task_id)
    team = batch.team_of(script)
    if claimed is None or (bridge_user is None and team != account_team):  # a script naming another team
        return mirror
    deadline = time.monotonic() + wait_s
    while True:
        try:
            if (records_of(team).get(claimed).get("slurm") or {}).get("id") == job.id:
                return team, claimed
        except UsageError:  # no record (yet)
            pass
        if time.monotonic() >= deadline:
            log.warning("Slurm job %s claims job %s, whose record names another Slurm job: it is %s", job.id,
                        claimed, mirror)
            return mirror
        sleep(0.5)


# where jobs get credentials of their own -> the scheme of a bare bucket name (Azure's is its container URL)
JOB_CLOUDS = {"aws": "s3://", "tencent": "cos://", "azure": ""}


def settings_of(args) -> dict:
    """node.json's, with the flags over it: the node's cloud (``aws`` where node.json names none), its region, and
    under the cloud's key the stack's ``bucket`` and the ``job_role_arn`` (infra.aws.stack, infra.tencent.derive)."""
    node = node_schema.load(node_schema.PATH) if Path(node_schema.PATH).exists() else {}
    cloud = node.get("cloud") or "aws"
    own = dict(node.get(cloud) or {})
    own.update({k: v for k, v in (("bucket", args.bucket), ("job_role_arn", args.role_arn)) if v})
    return {**node, "region": args.region or node.get("region"), cloud: own}


def parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m trainer credentials", description="A job's own cloud credentials on a node: "
                       "the loopback endpoint, and Slurm's Prolog and Epilog that grant and revoke them.")
    p.add_argument("action", choices=("serve", "prolog", "epilog"))
    p.add_argument("--dir", default=DIR, help="grants and tokens (default %(default)s)")
    p.add_argument("--port", type=int, default=PORT, help="the endpoint's loopback port (default %(default)s)")
    p.add_argument("--bucket", help="the stack's bucket's name (default node.json's <cloud>.bucket)")
    p.add_argument("--role-arn", help="the job role (default node.json's <cloud>.job_role_arn)")
    p.add_argument("--region", help="default node.json's region")
    p.add_argument("--bridge-user", help="the bridge submits every job as this user (a box whose user cannot make "
                   "others); default: each team's jobs as the team's own user (gpufleet-<team>)")
    return p


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    settings = settings_of(args)
    if args.action == "epilog":
        remove_grant(Path(args.dir), os.environ.get("SLURM_JOB_ID", ""))
        return 0
    cloud = settings.get("cloud") or "aws"
    own = settings[cloud]
    bucket = own.get("bucket") or settings.get("bucket")
    if not bucket or not settings.get("region"):
        raise UsageError("credentials: no bucket or region: give --bucket and --region, or run on a node whose "
                         "node.json has them")
    if args.action == "prolog":
        env = os.environ
        slurm_id = env.get("SLURM_JOB_ID", "")
        if not SLURM_ID.fullmatch(slurm_id) or not env.get("SLURM_JOB_UID", "").isdigit():
            raise UsageError("credentials prolog: SLURM_JOB_ID and SLURM_JOB_UID must be set (Slurm's Prolog)")
        uid = int(env["SLURM_JOB_UID"])
        gid = int(env["SLURM_JOB_GID"]) if env.get("SLURM_JOB_GID", "").isdigit() else uid
        records = partial(RecordStore.of_bucket, bucket if "://" in bucket else JOB_CLOUDS[cloud] + bucket)
        team, job_id = job_of(slurm_id, args.bridge_user, records)
        write_grant(Path(args.dir), slurm_id, team, job_id, uid, gid)
        log.info("Slurm job %s is job %s of team %s: granted", slurm_id, job_id, team)
        return 0
    if cloud != "azure" and not own.get("job_role_arn"):
        raise UsageError(f"credentials serve: no job role: give --role-arn, or run on a node whose node.json has "
                         f"{cloud}.job_role_arn")
    provider = adapter(cloud)
    _private_dir(Path(args.dir), 0o755)
    facts = provider.instance_facts() if settings.get("cloud") else {}  # only where node.json names the cloud
    if facts:  # what the metadata service no longer tells a job (its metrics' InstanceId, its instance type)
        _write_new(Path(INSTANCE), json.dumps(facts).encode(), 0o644)
    path = AZURE_PATH if cloud == "azure" else PATH
    server = serve(Broker(Path(args.dir), provider.job_issuer(settings), path=path), port=args.port)
    log.info("job credentials on http://%s:%d%s", HOST, server.server_address[1], path)
    server.serve_forever()
    return 0
