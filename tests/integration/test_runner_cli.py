"""compass-runner's command line, with the real binary: backend selection (the seed's
SelectBackend), help and version, and the refusals of bad values. Nothing here starts a
sandbox; the host tier is used (as uid 65534) only to show which backend was selected.
"""

import os
import pathlib
import subprocess

import pytest

from test_runner_host import AS_NOBODY, RUNNER, runner_env, tmp_nobody  # noqa: F401

VALID = ["podman", "microvm", "host", "apple-container"]


def cli(*args, env=None, as_nobody=False, cwd="/"):
    cmd = (AS_NOBODY if as_nobody else []) + [str(RUNNER), *args]
    full_env = {k: v for k, v in os.environ.items() if k != "COMPASS_RUNTIME_BACKEND"}
    full_env.update(env or {})
    return subprocess.run(cmd, env=full_env, cwd=cwd, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=60)


@pytest.fixture(autouse=True)
def _need_runner():
    if not RUNNER.exists():
        pytest.fail(f"compass-runner not found at {RUNNER} (cmake --build build)")


# ---------------------------------------------------------------------------------------
# Help and version


def test_version():
    r = cli("--version")
    assert r.returncode == 0
    assert r.stdout.startswith("compass-runner 0.")


def test_help_lists_every_subcommand():
    r = cli("--help")
    assert r.returncode == 0
    for sub in ("run", "agents", "stop", "resize", "gc", "image"):
        assert f"\n  {sub}" in r.stdout, sub


@pytest.mark.parametrize("sub,expect", [
    (["run"], ["--backend", "--bundle", "--egress-allow", "--egress", "--image", "--rootfs",
               "--memory", "--cpus", "--pids", "--workdir", "--sidecar-socket",
               "COMPASS_RUNTIME_BACKEND", "localhost/compass-agent:latest"]),
    (["agents"], ["--json"]),
    (["stop"], ["id"]),
    (["resize"], ["--memory", "--cpus", "--pids"]),
    (["gc"], []),
    (["image", "build"], ["--force", "--name", "localhost/compass-agent:latest"]),
])
def test_every_subcommand_has_help_with_defaults(sub, expect):
    r = cli(*sub, "--help")
    assert r.returncode == 0, r.stderr
    for word in expect:
        assert word in r.stdout, (sub, word)
    if sub == ["run"]:
        assert r.stdout.count("default") >= 5  # each optional flag says what absent means


def test_no_subcommand_and_unknown_subcommand_are_refused():
    assert cli().returncode == 2
    r = cli("launch")
    assert r.returncode == 2
    assert "launch" in r.stderr


# ---------------------------------------------------------------------------------------
# Backend selection


@pytest.mark.parametrize("how", ["flag", "env"])
def test_unknown_backend_is_rejected_listing_the_valid_names(how):
    if how == "flag":
        r = cli("run", "--backend", "docker", "--", "true")
        assert "--backend" in r.stderr
    else:
        r = cli("run", "--", "true", env={"COMPASS_RUNTIME_BACKEND": "docker"})
        assert "COMPASS_RUNTIME_BACKEND" in r.stderr
    assert r.returncode == 2
    assert '"docker": unknown backend' in r.stderr
    for name in VALID:
        assert name in r.stderr


@pytest.mark.parametrize("how", ["flag", "env"])
def test_apple_container_is_valid_but_needs_macos(how):
    if how == "flag":
        r = cli("run", "--backend", "apple-container", "--", "true")
    else:
        r = cli("run", "--", "true", env={"COMPASS_RUNTIME_BACKEND": "apple-container"})
    assert r.returncode == 2
    assert "needs macOS" in r.stderr
    assert "unknown backend" not in r.stderr


def test_environment_selects_the_host_tier(tmp_nobody):  # noqa: F811
    r = cli("run", "--", "true", env={"COMPASS_RUNTIME_BACKEND": "host", "TMPDIR":
                                      str(tmp_nobody)}, as_nobody=True, cwd=tmp_nobody)
    assert r.returncode == 0, r.stderr
    assert "(tier host, egress unenforced" in r.stderr


def test_flag_wins_over_the_environment(tmp_nobody):  # noqa: F811
    # A bad environment value does not matter when the flag is given...
    r = cli("run", "--backend", "host", "--", "true",
            env={"COMPASS_RUNTIME_BACKEND": "docker", "TMPDIR": str(tmp_nobody)},
            as_nobody=True, cwd=tmp_nobody)
    assert r.returncode == 0, r.stderr
    assert "(tier host," in r.stderr
    # ...and the flag, not the environment's "host", picks the tier.
    r = cli("run", "--backend", "apple-container", "--", "true",
            env={"COMPASS_RUNTIME_BACKEND": "host", "TMPDIR": str(tmp_nobody)},
            as_nobody=True, cwd=tmp_nobody)
    assert r.returncode == 2
    assert "needs macOS" in r.stderr


def test_empty_backend_flag_means_podman_not_the_environment(tmp_nobody):  # noqa: F811
    # --backend "" wins over COMPASS_RUNTIME_BACKEND=host and means the default (podman),
    # so the host tier's banner never appears.
    r = cli("run", "--backend", "", "--", "true",
            env={"COMPASS_RUNTIME_BACKEND": "host", "TMPDIR": str(tmp_nobody)},
            as_nobody=True, cwd=tmp_nobody)
    assert "tier host" not in r.stderr
    assert "egress is NOT enforced" not in r.stderr


# ---------------------------------------------------------------------------------------
# Bad values are refused naming the flag


@pytest.mark.parametrize("value", ["", "0", "lots", "12x", "-1", "1.5g", "1t", "2048g",
                                   "99999999999999999999999"])
def test_bad_memory_is_refused_naming_the_flag(value):
    r = cli("run", "--backend", "host", "--memory", value, "--", "true")
    assert r.returncode == 2
    assert "--memory" in r.stderr
    r = cli("resize", "a0000000000", "--memory", value)
    assert r.returncode == 2
    assert "--memory" in r.stderr


@pytest.mark.parametrize("flag,value", [
    ("--cpus", "0"), ("--cpus", "many"), ("--cpus", "1000"), ("--pids", "0"),
    ("--pids", "1"), ("--pids", "1.5"), ("--egress-allow", "x.test:80:80"),
    ("--egress-allow", "Mesh.Sam.Alt."), ("--egress", "open"), ("--egress-allow", "10.0.0.1"),
    ("--egress-allow", "*"), ("--egress-allow", "bad_name.example"), ("--workdir", "relative"),
    ("--workdir", "/../../tmp"), ("--workdir", "/tmp/.."),
    ("--rootfs", "/nonexistent-rootfs"), ("--bundle", "/nonexistent.yaml"),
])
def test_bad_values_are_refused_naming_the_flag(flag, value):
    r = cli("run", flag, value, "--", "true")
    assert r.returncode == 2, r.stderr
    assert flag in r.stderr


def test_memory_suffixes_are_accepted_as_binary_units(tmp_nobody):  # noqa: F811
    # Accepted by the parser, then refused by the host tier (no cgroup): the refusal proves
    # the value got that far.
    for value in ("67108864", "65536k", "64m", "1g", "1G"):
        r = cli("run", "--backend", "host", "--memory", value, "--", "true",
                env={"TMPDIR": str(tmp_nobody)}, as_nobody=True, cwd=tmp_nobody)
        assert r.returncode == 2
        assert "no cgroup" in r.stderr, (value, r.stderr)


def test_command_is_required():
    r = cli("run", "--backend", "host")
    assert r.returncode == 2
    assert "CMD is required" in r.stderr


def test_command_before_the_dashes_is_refused_not_half_parsed():
    """Without `--`, the command's own flags would be read as the runner's (curl --memory)."""
    r = cli("run", "--backend", "host", "curl", "--memory", "64m", "http://x.example/")
    assert r.returncode == 2, r
    assert "after `--`" in r.stderr and "curl" in r.stderr, r.stderr
    r = cli("run", "--backend", "host", "curl", "--", "-V")
    assert r.returncode == 2 and "came before it" in r.stderr, r.stderr


def test_flags_after_the_dashes_belong_to_the_agent(tmp_nobody):  # noqa: F811
    r = cli("run", "--backend", "host", "--", "sh", "-c", 'echo "$1"', "sh", "--memory",
            as_nobody=True, env=runner_env(tmp_nobody))
    assert r.returncode == 0, r
    assert r.stdout.strip() == "--memory"


def test_image_and_rootfs_exclude_each_other():
    r = cli("run", "--image", "x", "--rootfs", "/", "--", "true")
    assert r.returncode == 2
    assert "--image" in r.stderr and "--rootfs" in r.stderr


def test_bad_bundle_is_refused_with_its_field(tmp_path):
    bundle = tmp_path / "bundle.yaml"
    bundle.write_text("version: v1\nagent:\n  id: a.example\negress:\n  allow: [\"*\"]\n")
    r = cli("run", "--bundle", str(bundle), "--", "true")
    assert r.returncode == 2
    assert "--bundle" in r.stderr and "egress.allow[0]" in r.stderr


def test_bundle_that_serves_is_refused_not_ignored(tmp_path):
    b = tmp_path / "b.yaml"
    b.write_text("version: v1\nagent:\n  id: a.example\nserves:\n  name: a\n  port: 8080\n")
    for backend in ("host", "podman"):
        r = cli("run", "--backend", backend, "--bundle", str(b), "--", "true")
        assert r.returncode == 2, r
        assert "serves" in r.stderr, r.stderr


def test_resize_needs_a_limit_and_stop_needs_an_id():
    r = cli("resize", "a0000000000")
    assert r.returncode == 2
    assert "at least one of --memory, --cpus, --pids" in r.stderr
    assert cli("stop").returncode == 2


def test_resize_of_an_unknown_agent_names_it():
    r = cli("resize", "a0000000000", "--memory", "64m", env={"TMPDIR": "/nonexistent-tmp"})
    assert r.returncode == 1
    assert '"a0000000000"' in r.stderr


def test_agents_json_is_an_array_even_when_empty(tmp_path):
    r = cli("agents", "--json", env={"TMPDIR": str(tmp_path),
                                     "COMPASS_STATE_DIR": str(tmp_path / "none")})
    assert r.returncode == 0
    assert r.stdout.strip() == "[]"


def test_a_user_who_cannot_see_roots_agents_is_told_so(tmp_nobody):  # noqa: F811
    """The podman and microvm tiers record their agents under a root-owned 0700 directory: a
    non-root `agents` or `stop` cannot look there, and must say so rather than show an empty
    roster or "no live agent" as if that were the whole story."""
    import shutil
    import tempfile
    root_state = pathlib.Path(tempfile.mkdtemp(prefix="compass-cli-state-", dir="/tmp"))
    try:
        _told_about(root_state, tmp_nobody)
    finally:
        shutil.rmtree(root_state)


def _told_about(root_state, tmp_nobody):  # noqa: F811
    env = {"TMPDIR": str(tmp_nobody), "COMPASS_STATE_DIR": str(root_state)}
    r = cli("agents", env=env, as_nobody=True)
    assert r.returncode == 0, r.stderr
    assert f"recorded under {root_state}, which belongs to uid 0" in r.stderr, r.stderr
    r = cli("stop", "a0123456789", env=env, as_nobody=True)
    assert r.returncode == 1
    assert '"a0123456789"' in r.stderr and "belongs to uid 0" in r.stderr, r.stderr
    # Root sees everything: no such note.
    r = cli("agents", env={"COMPASS_STATE_DIR": str(root_state)})
    assert r.returncode == 0 and "belongs to uid" not in r.stderr, r.stderr


@pytest.mark.parametrize("root,reason", [
    ("/tmp/" + "x" * 90, "must fit a Unix socket path"),
    ("relative/state", "not an absolute path"),
    ("/tmp/state\nroot", "control"),
    ("/tmp/state:root", "must not hold ':'"),
])
def test_an_unusable_state_root_is_refused_before_anything_starts(root, reason):
    """COMPASS_STATE_DIR is the operator's input: one too long for the agent's sockets failed
    late (sam-box: "File name too long", exit 70) instead of naming the variable."""
    r = cli("run", "--backend", "podman", "--", "true", env={"COMPASS_STATE_DIR": root})
    assert r.returncode == 2, r.stderr
    assert "COMPASS_STATE_DIR" in r.stderr and reason in r.stderr, r.stderr
    assert not os.path.exists(root.split("\n")[0]), "the refused root was written to"


@pytest.mark.parametrize("command", [["agents"], ["agents", "--json"], ["gc"],
                                     ["stop", "a0123456789"], ["resize", "a0123456789",
                                                               "--memory", "64m"]])
def test_every_command_refuses_a_relative_state_root_as_a_usage_error(command, tmp_path):
    """A relative COMPASS_STATE_DIR is the operator's input error whichever command reads it:
    exit 2 as for `run`, naming the variable, and nothing made below the working directory."""
    r = cli(*command, env={"COMPASS_STATE_DIR": "relative/state"}, cwd=tmp_path)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "COMPASS_STATE_DIR" in r.stderr and "not an absolute path" in r.stderr, r.stderr
    assert not (tmp_path / "relative").exists()


@pytest.mark.parametrize("egress, missing", [
    ("firewall", ["podman", "ip", "nft"]),
    ("boundary", ["podman", "ip"]),
])
def test_preflight_names_every_missing_program_at_once(egress, missing, tmp_path):
    """Without podman, ip and (egress firewall) nft on PATH, one start names all of them, so
    the operator installs them in one go; and nothing is made (no netns) before it refuses."""
    if os.geteuid() != 0:
        pytest.skip("the podman tier runs as root")
    empty = tmp_path / "bin"
    empty.mkdir()
    netns = pathlib.Path("/run/netns")
    before = set(netns.glob("compass-*")) if netns.exists() else set()
    r = cli("run", "--backend", "podman", "--egress", egress, "--egress-allow", "x.example",
            "--", "true", env={"PATH": str(empty), "TMPDIR": str(tmp_path)})
    assert r.returncode == 70, (r.returncode, r.stderr)
    lines = [l for l in r.stderr.splitlines() if "preflight:" in l]
    assert len(lines) == 1, r.stderr
    for program in missing:
        assert f"cannot run {program}: not found on PATH" in lines[0], r.stderr
    if egress == "boundary":
        assert "cannot run nft" not in lines[0]
    after = set(netns.glob("compass-*")) if netns.exists() else set()
    assert after == before
