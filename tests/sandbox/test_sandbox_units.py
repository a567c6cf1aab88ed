"""Fast unit tests: spec parsing, the bwrap command line, output caps, the wire protocol. No sandbox started."""
from __future__ import annotations

import socket

import pytest

from envhub.sandbox import SandboxSpec, get_runtime
from envhub.sandbox.agent import protocol
from envhub.sandbox.agent.limits import OutputCap
from envhub.sandbox.base import RuntimeUnavailable, SandboxError
from envhub.sandbox.bwrap import _python_binds, bwrap_argv
from envhub.sandbox.common import server_config


def test_spec_defaults_and_binds():
    spec = SandboxSpec(binds=["/data", "/src:/mnt/src:rw", ("/opt", "/o")])
    assert spec.workdir == "/testbed" and spec.network is False and spec.runtime == "auto"
    assert spec.parsed_binds() == [("/data", "/data", "ro"), ("/src", "/mnt/src", "rw"), ("/opt", "/o", "ro")]
    assert SandboxSpec().key() == SandboxSpec().key() != SandboxSpec(memory_mb=1).key()
    for bad in (["rel/path"], ["/a:/b:rx"], [("/a", "b")], [42]):
        with pytest.raises(ValueError, match="bad bind"):
            SandboxSpec(binds=bad).parsed_binds()


def _argv(spec: SandboxSpec) -> list[str]:
    cfg = server_config(spec, "x", "/run/envhub/server.sock", "/run/envhub", spec.workdir, child_memory=False,
                        nproc_rlimit=False)
    python, binds, path = _python_binds(spec)
    return bwrap_argv(spec, "/tmp/state", cfg, python, path, binds, 5, 6)


def _pairs(argv: list[str], flag: str) -> list[tuple[str, str]]:
    return [(argv[i + 1], argv[i + 2]) for i, a in enumerate(argv) if a == flag]


def test_bwrap_argv_isolation_flags():
    argv = _argv(SandboxSpec(tmp_size_mb=64))
    for flag in ("--unshare-all", "--unshare-user", "--die-with-parent", "--new-session", "--clearenv"):
        assert flag in argv
    assert "--share-net" not in argv
    assert argv[argv.index("--uid") + 1] == "1000"
    ro = dict(_pairs(argv, "--ro-bind"))
    assert "/" not in ro and "/root" not in ro and "/etc" not in ro  # never the whole host, home or /etc
    assert ro["/usr"] == "/usr" and "/etc/shadow" not in ro
    assert ("/tmp/state/workspace", "/testbed") in _pairs(argv, "--bind")
    assert ("/tmp/state/run", "/run/envhub") in _pairs(argv, "--bind")
    i = argv.index("--tmpfs")  # the private /tmp is a tmpfs with the requested size
    assert argv[i + 1] == "/tmp" and argv[i - 2:i] == ["--size", str(64 << 20)]
    assert argv[argv.index("--info-fd") + 1] == "5" and argv[argv.index("--block-fd") + 1] == "6"


def test_bwrap_argv_network_tmpfs_workspace_and_binds(tmp_path):
    argv = _argv(SandboxSpec(network=True, workspace_size_mb=32, workspace_from=str(tmp_path),
                             binds=[f"{tmp_path}:/data:rw"]))
    assert "--share-net" in argv
    i = argv.index("/testbed")
    assert argv[i - 1] == "--tmpfs" and str(32 << 20) in argv[i - 5:i]
    assert (str(tmp_path), "/run/envhub-src") in _pairs(argv, "--ro-bind")
    assert (str(tmp_path), "/data") in _pairs(argv, "--bind")
    with pytest.raises(SandboxError, match="does not exist"):
        _argv(SandboxSpec(binds=["/definitely/not/here"]))


def test_output_cap_keeps_head_and_tail():
    cap = OutputCap(10)
    for chunk in (b"0123", b"456789", b"abcdefghij"):
        cap.feed(chunk)
    assert cap.total == 20 and cap.cut == 10
    text = cap.text()
    assert text.startswith("01234") and text.endswith("fghij") and "10 bytes of output cut" in text
    small = OutputCap(100)
    small.feed(b"hello")
    assert small.text() == "hello" and small.cut == 0
    quiet = OutputCap(100)  # no output (or only empty reads): nothing allocated, an empty result
    quiet.feed(b"")
    assert (quiet.text(), quiet.cut, quiet.total, quiet.tail_bytes()) == ("", 0, 0, b"")
    nothing_kept = OutputCap(0)
    nothing_kept.feed(b"abc")
    assert nothing_kept.cut == 3 and nothing_kept.tail_bytes() == b"" and "3 bytes of output cut" in nothing_kept.text()


def test_protocol_roundtrip_and_bad_frames():
    a, b = socket.socketpair()
    with a, b:
        protocol.send(a, {"op": "ping", "x": "é" * 1000})
        assert protocol.recv(b) == {"op": "ping", "x": "é" * 1000}
        a.sendall(b"\x00\x00\x00\x03[1]")
        with pytest.raises(protocol.ProtocolError, match="JSON object"):
            protocol.recv(b)
        a.sendall(b"\xff\xff\xff\xff")
        with pytest.raises(protocol.ProtocolError, match="frame"):
            protocol.recv(b)
    c, d = socket.socketpair()
    c.close()
    with d, pytest.raises(protocol.ProtocolError, match="closed"):
        protocol.recv(d)


def test_runtime_selection():
    assert get_runtime("local").name == "local"
    with pytest.raises(RuntimeUnavailable, match="unknown sandbox runtime 'nope'"):
        get_runtime("nope")
    auto = get_runtime("auto")
    assert auto.name != "local"  # never chosen without asking


def test_the_sandboxes_parent_cgroup_weighs_as_many_processes_as_the_host_has_cpus():
    """All sandboxes share one parent cgroup, one CFS entity: at the default weight they would together get one
    process's share of a busy host (see ``cgroups.parent_weight``). Each sandbox's own quota is unchanged."""
    import os

    from envhub.sandbox import cgroups

    assert cgroups.parent_weight(1, 2) == "2048" and cgroups.parent_weight(2, 2) == "200"
    assert cgroups.parent_weight(1, 1) == "1024" and cgroups.parent_weight(2, 256) == "10000"  # v2's ceiling
    if "cpu" not in cgroups.available():
        pytest.skip("no cpu cgroup can be made on this host")
    parent, version = cgroups.parents()["cpu"]
    with open(os.path.join(parent, "cpu.shares" if version == 1 else "cpu.weight")) as f:
        assert f.read().strip() == cgroups.parent_weight(version)
    sb = cgroups.SandboxCgroups("weight-test", None, None, 0.5)
    try:
        d, _ = sb.dirs["cpu"]
        quota = open(os.path.join(d, "cpu.cfs_quota_us" if version == 1 else "cpu.max")).read().split()[0]
        assert int(quota) == cgroups.CPU_PERIOD_US // 2  # the cap itself is untouched
    finally:
        sb.remove()
