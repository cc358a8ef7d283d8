#!/usr/bin/python3
"""microvm tier benchmark: launch → agent exec, against a plain QEMU microvm boot of the same
kernel and initramfs (issue 5, "Benchmark").

    sudo /usr/bin/python3 bench/microvm_bench.py              # 5 rounds, --accel tcg
    sudo /usr/bin/python3 bench/microvm_bench.py --rounds 3   # fewer rounds

Both cases are timed on the host, from just before the process is started to the moment a
marker line arrives on its stdout (the guest's clock is not the host's, so no timestamp is
taken inside the guest):

- plain:   `qemu-system-x86_64 -M microvm … -kernel K -initrd I` where I is the runner's own
           cached base initramfs with its /init replaced (a later cpio archive) by one that
           prints the marker on the serial console (QEMU's stdout) and powers off.
- microvm: `compass-runner run --backend microvm --accel A -- echo MARKER` (sam-box, the
           cached erofs root, the initramfs, modules, overlay, switch_root, nano-init, the
           agent; the marker arrives through the guest's stdout port).
- floor:   the plain boot's QEMU with the tier's disk (the cached erofs root) and virtio-serial
           device added, and an /init that does only what any launch step must do with this
           Debian kernel before an agent can run: stage 1's early mounts, `modprobe -a` of the
           modules the tier needs (the cloud kernel has virtio-mmio, virtio-blk,
           virtio-console, erofs, overlay and tun as modules), and the root mounted (erofs and
           the tmpfs overlay); then the agent's own command run from that root (`chroot /newroot
           echo MARKER`: its binary and libc read from the image's disk and loaded, as the
           agent's are). No nano-init, no user switch, nothing on the host.
           floor / plain is the least the tier can add on this kernel and accelerator;
           microvm / floor is what the tier adds beyond that.
- firewall: the same with `--egress firewall` (netns, veth, bridge, tap, host table and DNS
           forwarder on the host; 13 more modules, `nft -f` and eth0 in the guest; the agent
           under `nano-init supervise`). `--no-firewall` leaves it out.

The cases rotate round by round so that load on the host hits both alike. Target: each microvm case
≤ 1.1 × plain (median). Prints PASS/MISS and exits 0 either way; non-zero only if a case could
not run. The results also go to bench/results/microvm-<time>.json. Needs root, the local image
and a build in build/ (or --build DIR). No traffic leaves the machine.
"""

import argparse
import datetime
import glob
import json
import os
import pathlib
import select
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
KERNEL_DIR = pathlib.Path(os.environ.get("COMPASS_GUEST_KERNEL",
                                         "/usr/local/lib/compass/guest-kernel"))
CACHE = pathlib.Path(os.environ.get("COMPASS_MICROVM_CACHE", "/var/lib/compass/microvm"))
TARGET_RATIO = 1.1
MARKER = "COMPASS-BENCH-MARKER"
PLAIN_INIT = f"""#!/bin/busybox sh
/bin/busybox mount -t proc proc /proc
echo {MARKER} > /dev/console
/bin/busybox poweroff -f
"""
# Stage 1 of the launch step (src/compass-runner/microvm_guest_scripts.cc) cut to what it cannot
# do without (the same fstab files and module list, from the same base initramfs), then the
# agent's command from the root, as the microvm case runs it.
FLOOR_INIT = f"""#!/bin/busybox sh
B=/bin/busybox
$B mount -a -T /etc/fstab.early || exit 1
read -r modules < /lib/modules/order
$B modprobe -a $modules || exit 1
until [ -b /dev/vda ]; do $B usleep 10000; done
$B mkdir /rw/upper /rw/work && $B mount -a -T /etc/fstab.root || exit 1
$B chroot /newroot echo {MARKER}
$B poweroff -f
"""


def newc(entries):
    """A cpio newc archive: entries are (name, mode, data)."""
    out = bytearray()
    for ino, (name, mode, data) in enumerate([*entries, ("TRAILER!!!", 0, b"")], start=1):
        fields = [ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(name) + 1, 0]
        out += b"070701" + b"".join(b"%08X" % f for f in fields) + name.encode() + b"\0"
        out += b"\0" * (-len(out) % 4)
        out += data
        out += b"\0" * (-len(out) % 4)
    return bytes(out)


def timed(argv, env, timeout=600):
    """Starts argv; returns (ms until a stdout line holds MARKER, ms until exit)."""
    t0 = time.monotonic()
    p = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    marker_ms, buf = None, b""
    deadline = t0 + timeout
    fd = p.stdout.fileno()
    while marker_ms is None and time.monotonic() < deadline:
        r, _, _ = select.select([fd], [], [], 1.0)
        if not r:
            if p.poll() is not None:
                break
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        buf += chunk
        if MARKER.encode() in buf:
            marker_ms = (time.monotonic() - t0) * 1000
    _, err = p.communicate(timeout=max(1, deadline - time.monotonic()))
    total_ms = (time.monotonic() - t0) * 1000
    if marker_ms is None:
        raise RuntimeError(f"{argv[:5]}… no marker (exit {p.returncode}): "
                           f"{err.decode(errors='replace')[-600:]}")
    return marker_ms, total_ms


def summarize(xs):
    return {"n": len(xs), "median_ms": round(statistics.median(xs), 1),
            "min_ms": round(min(xs), 1), "max_ms": round(max(xs), 1)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5, help="rounds (each runs both cases)")
    ap.add_argument("--accel", default="tcg", choices=["tcg", "kvm"])
    ap.add_argument("--build", default=str(REPO / "build"), help="build dir (default build/)")
    ap.add_argument("--no-firewall", action="store_true", help="skip the --egress firewall case")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("microvm_bench: run as root")
    runner = pathlib.Path(args.build) / "src/compass-runner/compass-runner"
    env = dict(os.environ)
    env.pop("CONTAINERS_CONF", None)
    run_argv = [str(runner), "run", "--backend", "microvm", "--accel", args.accel, "--",
                "echo", MARKER]

    dashes = run_argv.index("--")
    fw_argv = run_argv[:dashes] + ["--egress", "firewall"] + run_argv[dashes:]
    cases = [("plain", None), ("floor", None), ("microvm", run_argv)]
    if not args.no_firewall:
        cases.append(("firewall", fw_argv))

    # Warm-up: builds the cached erofs root, base initramfs and firewall layer (not measured).
    print("warm-up (builds the cached root image and initramfs)…", flush=True)
    timed(run_argv, env)
    if not args.no_firewall:
        timed(fw_argv, env)
    bases = sorted(glob.glob(str(CACHE / "initramfs-*.cpio")), key=os.path.getmtime)
    kernels = sorted(glob.glob(str(KERNEL_DIR / "boot/vmlinuz-*")))
    roots = sorted(glob.glob(str(CACHE / "rootfs-*.erofs")), key=os.path.getmtime)
    if not bases or not kernels or not roots:
        sys.exit("microvm_bench: no cached initramfs, root image or guest kernel "
                 "(run install-deps, then compass-runner image build)")
    initrds = {}
    for name, init in (("plain", PLAIN_INIT), ("floor", FLOOR_INIT)):
        with tempfile.NamedTemporaryFile(suffix=".cpio", delete=False) as f:
            f.write(pathlib.Path(bases[-1]).read_bytes())
            f.write(newc([("init", 0o100755, init.encode())]))
            initrds[name] = f.name
    tcg = args.accel == "tcg"
    append = "console=ttyS0 quiet panic=-1 reboot=t rdinit=/init"
    if tcg:
        append += " tsc_early_khz=2000000 lpj=8000000"
    def qemu_argv(initrd, *devices):
        return ["qemu-system-x86_64", "-M", "microvm,pit=on,pic=on,rtc=on,isa-serial=on",
                "-accel", args.accel, "-cpu", "qemu64" if tcg else "host", "-m", "512M",
                "-smp", "1", "-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
                "-kernel", kernels[-1], "-initrd", initrd, "-append", append,
                "-serial", "stdio", *devices]

    cases[0] = ("plain", qemu_argv(initrds["plain"]))
    # The tier's disk and virtio-serial device, as compass-runner gives them (microvm_qemu.cc).
    cases[1] = ("floor", qemu_argv(
        initrds["floor"],
        "-drive", f"if=none,id=root,format=raw,readonly=on,file={roots[-1]}",
        "-device", "virtio-blk-device,drive=root",
        "-device", "virtio-serial-device,max_ports=8"))
    samples = {name: [] for name, _ in cases}
    totals = {name: [] for name, _ in cases}
    try:
        for i in range(args.rounds):
            order = cases[i % len(cases):] + cases[:i % len(cases)]
            for name, argv in order:
                marker, total = timed(argv, env)
                samples[name].append(marker)
                totals[name].append(total)
                print(f"round {i + 1}: {name:8s} marker {marker:8.0f} ms  exit {total:8.0f} ms",
                      flush=True)
    finally:
        for path in initrds.values():
            os.unlink(path)
    plain, vm = summarize(samples["plain"]), summarize(samples["microvm"])
    ratio = vm["median_ms"] / plain["median_ms"]
    verdict = "PASS" if ratio <= TARGET_RATIO else "MISS"
    print(f"\naccelerator: {args.accel}; {args.rounds} rounds, rotating")
    print(f"plain QEMU boot to marker: median {plain['median_ms']:.0f} ms "
          f"(min {plain['min_ms']:.0f}, max {plain['max_ms']:.0f})")
    print(f"microvm launch → agent exec: median {vm['median_ms']:.0f} ms "
          f"(min {vm['min_ms']:.0f}, max {vm['max_ms']:.0f})")
    print(f"ratio {ratio:.2f} (target ≤ {TARGET_RATIO}): {verdict}")
    floor = summarize(samples["floor"])
    floor["ratio"] = round(floor["median_ms"] / plain["median_ms"], 3)
    floor["microvm_over_floor"] = round(vm["median_ms"] / floor["median_ms"], 3)
    print(f"floor (modules, root mount, the agent's exec) to marker: median {floor['median_ms']:.0f} ms "
          f"(min {floor['min_ms']:.0f}, max {floor['max_ms']:.0f}); {floor['ratio']:.2f}× plain, "
          f"so the tier adds {vm['median_ms'] - floor['median_ms']:.0f} ms "
          f"({floor['microvm_over_floor']:.2f}×) beyond it")
    fw = None
    if samples.get("firewall"):
        fw = summarize(samples["firewall"])
        fw["ratio"] = round(fw["median_ms"] / plain["median_ms"], 3)
        fw["verdict"] = "PASS" if fw["ratio"] <= TARGET_RATIO else "MISS"
        fw["exit"] = summarize(totals["firewall"])
        print(f"microvm --egress firewall launch → agent exec: median {fw['median_ms']:.0f} ms "
              f"(min {fw['min_ms']:.0f}, max {fw['max_ms']:.0f}); ratio {fw['ratio']:.2f} "
              f"(target ≤ {TARGET_RATIO}): {fw['verdict']}")
    RESULTS.mkdir(exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = RESULTS / f"microvm-{stamp}.json"
    out.write_text(json.dumps({"accel": args.accel, "rounds": args.rounds,
                               "plain": plain, "microvm": vm, "ratio": round(ratio, 3),
                               "target": TARGET_RATIO, "verdict": verdict,
                               "plain_exit": summarize(totals["plain"]),
                               "microvm_exit": summarize(totals["microvm"]),
                               "firewall": fw, "floor": floor,
                               "load_avg": os.getloadavg()}, indent=2) + "\n")
    print(f"results: {out}")


if __name__ == "__main__":
    main()
