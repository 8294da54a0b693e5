"""Clusters src_dask starts are private by default (loopback, 0700 worker directories),
TLS when asked, and stacks cannot point their factors outside their folder."""

from __future__ import annotations

import datetime
import json
import os
import runpy
import shutil
import signal
import stat
from pathlib import Path

import dask
import psutil
import pytest
import zarr
from distributed import Client, LocalCluster, Security
from helpers import dense_product, random_mpo, random_mps, rel_err

import src_dask
from src_dask import _cluster as C
from src_dask._cli import main

ANY = ("0.0.0.0", "::")
ROOT = Path(__file__).resolve().parent.parent


def listening() -> set[tuple[int, str, int]]:
    """(pid, address, port) of the sockets this process and its children listen on."""
    me = psutil.Process()
    out = set()
    for proc in [me, *me.children(recursive=True)]:
        try:
            conns = proc.net_connections(kind="inet")
        except psutil.NoSuchProcess:  # a child that just ended
            continue
        out |= {(proc.pid, c.laddr.ip, c.laddr.port) for c in conns
                if c.status == psutil.CONN_LISTEN}
    return out


def port(address: str) -> int:
    return int(address.rsplit(":", 1)[1].split("/")[0])


def takes_no_sigint() -> bool:
    """In a worker: SIGINT is ignored or blocked (a Ctrl-C does not reach Python)."""
    return (signal.getsignal(signal.SIGINT) == signal.SIG_IGN
            or signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, []))


def worker_folders(client: Client) -> list[Path]:
    """The workers' own folders (distributed puts them at
    ``<local_directory>/dask-scratch-space/worker-…``)."""
    return [Path(d) for d in client.run(lambda dask_worker: dask_worker.local_directory)
            .values()]


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(C, "has_gpu", lambda: False)


# -- cluster() ------------------------------------------------------------------------------
def test_cluster_listens_on_loopback_and_spills_to_a_private_folder(tmp_path, no_gpu):
    before = listening()
    parent = tmp_path / "spill"
    with src_dask.cluster(n_workers=2, memory_limit="1GiB",
                          local_directory=str(parent)) as cluster, Client(cluster) as client:
        new = listening() - before
        assert new and not [s for s in new if s[1] in ANY], sorted(new)
        assert {ip for _, ip, _ in new} == {"127.0.0.1"}
        ports = {p for *_, p in new}
        assert port(cluster.scheduler_address) in ports
        assert port(cluster.dashboard_link.split("//")[1]) in ports
        assert {pid for pid, *_ in new} - {os.getpid()}  # the worker processes' sockets too
        private = worker_folders(client)
        assert len(private) == 2 and all(p.parents[1] == parent for p in private)
        assert all(stat.S_IMODE(p.stat().st_mode) == 0o700 for p in private)
        assert all(client.run(takes_no_sigint).values())
    assert not any(p.exists() for p in private)  # removed with the cluster


def test_cluster_host_opens_it(no_gpu):
    before = listening()
    with src_dask.cluster(n_workers=1, processes=False, host="0.0.0.0",
                          dashboard_address="0.0.0.0:0") as cluster:
        new = listening() - before
        assert (os.getpid(), "0.0.0.0", port(cluster.scheduler_address)) in new


def test_cluster_with_tls_computes(no_gpu):
    security = Security.temporary()
    with src_dask.cluster(n_workers=1, processes=False, security=security,
                          dashboard_address=None) as cluster, Client(cluster) as client:
        assert cluster.scheduler_address.startswith("tls://127.0.0.1:")
        a, x = random_mpo(5, 2, seed=1), random_mps(5, 3, seed=2)
        y = src_dask.apply(a, x, 12, seed=0, client=client)
        assert rel_err(y, dense_product(a, x)) <= 1e-12
        with pytest.raises(OSError, match="TLS certificate does not match"):
            Client(cluster.scheduler_address, security=Security.temporary(), timeout="5s")


# -- the command line ---------------------------------------------------------------------
@pytest.fixture
def problem(tmp_path):
    a, x = tmp_path / "A.zarr", tmp_path / "x.zarr"
    assert main(["generate", "mpo", str(a), "--sites", "6", "--bond", "2", "--seed", "1"]) == 0
    assert main(["generate", "mps", str(x), "--sites", "6", "--bond", "4", "--seed", "2"]) == 0
    return str(a), str(x)


def watch_runs(monkeypatch) -> list[dict]:
    """Record, at each src_dask.src the command line makes, what its cluster looks like."""
    seen: list[dict] = []
    real = src_dask.src

    def src(*trains, client=None, **kwargs):
        info = {"address": client.scheduler.address, "listening": listening()}
        if client.run(lambda: 1):
            (info["spill"],) = worker_folders(client)
            info["mode"] = stat.S_IMODE(info["spill"].stat().st_mode)
            info["no_sigint"] = all(client.run(takes_no_sigint).values())
        seen.append(info)
        return real(*trains, client=client, **kwargs)

    monkeypatch.setattr(src_dask, "src", src)
    return seen


def test_cli_workers_are_private(problem, tmp_path, monkeypatch, capsys):
    before = listening()
    seen = watch_runs(monkeypatch)
    spill = tmp_path / "spill"
    assert main(["run", *problem, "--chi-out", "6", "--seed", "1", "--workers", "1",
                 "--local-directory", str(spill), "--out", str(tmp_path / "y")]) == 0
    assert "dashboard: http://127.0.0.1:" in capsys.readouterr().err
    (run,) = seen
    new = run["listening"] - before
    assert {ip for _, ip, _ in new} == {"127.0.0.1"}, sorted(new)
    assert {pid for pid, *_ in new} - {os.getpid()}  # the worker process's sockets too
    assert run["spill"].parents[1] == spill and run["mode"] == 0o700 and run["no_sigint"]
    assert not run["spill"].exists()  # removed after the run


def write_certificates(folder: Path) -> tuple[str, str, str]:
    """A CA, and a certificate and key it signed (for 127.0.0.1): PEM files."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())

    def name(cn):
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def builder(subject, public_key):
        return (x509.CertificateBuilder().subject_name(name(subject)).issuer_name(name("test CA"))
                .public_key(public_key).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=1))
                .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), False)
                .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                    ca_key.public_key()), False))

    usage = dict(content_commitment=False, data_encipherment=False, key_agreement=False,
                 encipher_only=False, decipher_only=False)
    ca = (builder("test CA", ca_key.public_key())
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), True)
          .add_extension(x509.KeyUsage(digital_signature=False, key_encipherment=False,
                                       key_cert_sign=True, crl_sign=True, **usage), True)
          .sign(ca_key, hashes.SHA256()))
    import ipaddress

    leaf = (builder("src-dask", key.public_key())
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=True,
                                         key_cert_sign=False, crl_sign=False, **usage), True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                  ExtendedKeyUsageOID.CLIENT_AUTH]), False)
            .add_extension(x509.SubjectAlternativeName(
                [x509.DNSName("localhost"),
                 x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .sign(ca_key, hashes.SHA256()))
    paths = [folder / "ca.pem", folder / "cert.pem", folder / "key.pem"]
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    paths[2].chmod(0o600)
    return tuple(str(p) for p in paths)  # type: ignore[return-value]


@pytest.fixture
def tls_cluster(tmp_path):
    """A TLS cluster (in this process) of certificates written to files: its scheduler
    file, and the CLI's flags for those files."""
    ca, cert, key = write_certificates(tmp_path)
    security = Security(tls_ca_file=ca, tls_scheduler_cert=cert, tls_scheduler_key=key,
                        tls_worker_cert=cert, tls_worker_key=key, tls_client_cert=cert,
                        tls_client_key=key, require_encryption=True)
    with LocalCluster(n_workers=1, processes=False, security=security, protocol="tls://",
                      dashboard_address=None) as cluster, Client(cluster) as client:
        assert cluster.scheduler_address.startswith("tls://")
        scheduler_file = tmp_path / "scheduler.json"
        client.write_scheduler_file(str(scheduler_file))
        assert json.loads(scheduler_file.read_text())["address"].startswith("tls://")
        yield str(scheduler_file), ["--tls-ca-file", ca, "--tls-cert", cert, "--tls-key", key]


def test_cli_tls(problem, tmp_path, tls_cluster, monkeypatch, capsys):
    """--tls-*: onto a TLS cluster through its scheduler file, and for --workers; without
    them, Dask config's TLS settings; no certificate, no connection."""
    scheduler_file, flags = tls_cluster
    run = ["run", *problem, "--chi-out", "6", "--seed", "1"]
    on_it = [*run, "--scheduler-file", scheduler_file]
    assert main([*on_it, *flags, "--out", str(tmp_path / "y1")]) == 0
    assert "connected to tls://" in capsys.readouterr().err
    assert main([*on_it, "--out", str(tmp_path / "y2")]) == 1  # no certificate
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        f"src-dask: error: {scheduler_file}: the scheduler at tls://127.0.0.1:"), err
    assert "takes TLS connections only; pass --tls-ca-file, --tls-cert and --tls-key" in err[0]
    assert not (tmp_path / "y2").exists()
    ca, cert, key = flags[1::2]
    config = {"distributed.comm.require-encryption": True, "distributed.comm.tls.ca-file": ca,
              "distributed.comm.tls.client.cert": cert, "distributed.comm.tls.client.key": key}
    with dask.config.set(config):
        assert main([*on_it, "--out", str(tmp_path / "y3")]) == 0
    # --workers: the local cluster uses them (in this process, to start fast)
    import distributed

    seen = watch_runs(monkeypatch)
    monkeypatch.setattr(distributed, "LocalCluster",
                        lambda **kw: LocalCluster(processes=False, **kw))
    assert main([*run, "--workers", "1", *flags, "--out", str(tmp_path / "y4")]) == 0
    assert seen[-1]["address"].startswith("tls://127.0.0.1:")
    ys = [src_dask.open(tmp_path / f"y{i}").to_dense() for i in (1, 3, 4)]
    assert all(abs(y - ys[0]).max() <= 1e-12 * abs(ys[0]).max() for y in ys)


def test_slurm_driver_over_tls(problem, tmp_path, tls_cluster, capsys):
    """examples/slurm/driver.py with the certificate files the job script passes it."""
    scheduler_file, flags = tls_cluster
    for i, path in enumerate(problem):
        shutil.copytree(path, tmp_path / "in" / str(i))
    driver = runpy.run_path(str(ROOT / "examples/slurm/driver.py"))
    driver["main"](["--scheduler-file", scheduler_file, "--inputs", str(tmp_path / "in"),
                    "--store", str(tmp_path / "run.zarr"), "--chi-out", "6", *flags])
    assert "written to" in capsys.readouterr().out
    assert zarr.open_group(tmp_path / "run.zarr", mode="r").attrs["complete"] is True


# -- crafted stacks ------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["dotdot", "absolute", "symlink"])
def test_stack_factors_must_stay_inside_the_stack(tmp_path, capsys, how):
    stack = tmp_path / "stack"
    assert main(["generate", "stack", str(stack), "--sites", "3", "--dm", "3"]) == 0
    elsewhere = tmp_path / "elsewhere.zarr"
    shutil.copytree(stack / "M", elsewhere)  # a train that would fit in M's place
    factor = {"dotdot": "../elsewhere.zarr", "absolute": str(elsewhere), "symlink": "L"}[how]
    if how == "symlink":
        (stack / "L").symlink_to(elsewhere)
    zarr.open_group(stack, mode="r+").attrs["factors"] = ["N", "V", factor, "U"]
    capsys.readouterr()
    for argv in (["info", str(stack)],
                 ["run", str(stack), "--chi-out", "4", "--out", str(tmp_path / "y")]):
        assert main(argv) == 1, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1, err
        assert err[0].startswith(f"src-dask: error: {stack}: stack factor {factor!r} is "
                                 "outside the stack folder"), err
    assert not (tmp_path / "y").exists()
