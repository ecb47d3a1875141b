#!/usr/bin/python3
"""check_deploy.py — the deployment files checked as far as a machine without
a Docker engine, a Kubernetes cluster or systemd as PID 1 allows
(deploy/README.md, "What is checked"):

  check_deploy.py manifests         the Kubernetes manifests: parsed, every
                                    object against tests/deploy/k8s-schema.json
                                    (the fields used, from the API reference),
                                    selectors match pod labels, probe and Service
                                    ports name a container port, every ConfigMap
                                    key a pod mounts exists (made by a manifest or
                                    by the README's kubectl command), the config
                                    and artifact paths the container reads are
                                    mounted, namespaces agree, the configs' DNS
                                    names are the Services', the grace period
                                    covers the drain, the image is the one the
                                    README builds and is not pulled from a registry,
                                    the Dockerfile's port is the health check's
  check_deploy.py docker-context BUILD_DIR
                                    the Docker build context as .dockerignore
                                    makes it, copied elsewhere, configured as the
                                    Dockerfile does (cmake -S . -B build): it
                                    must work, and without .dockerignore (a stale
                                    build tree copied in) it must not, when there
                                    is one to copy
  check_deploy.py systemd BUILD_DIR the unit against a scratch install
                                    (cmake --install): Documentation= files exist,
                                    ExecStart's binary runs, StateDirectory and
                                    LogsDirectory are set, TimeoutStopSec covers
                                    the drain; systemd-analyze verify on it (when
                                    installed); then the unit's own command lines
                                    run as systemd would run them, against
                                    emulated workers: ExecStartPre, ExecStart,
                                    a request, ExecReload, SIGTERM -> exit 0

Exit 0 when everything holds; 1 with every problem listed; 77 (skipped) when
a tool it needs is missing (python3-yaml, python3-jsonschema).
"""
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
problems = []


def problem(msg):
    problems.append(msg)


def finish(what):
    if problems:
        for p in dict.fromkeys(problems):
            print(f"check_deploy {what}: {p}", file=sys.stderr)
        sys.exit(1)
    print(f"check_deploy {what}: ok")
    sys.exit(0)


def read(path):
    with open(os.path.join(ROOT, path)) as f:
        return f.read()


# ---- Kubernetes ------------------------------------------------------------------

def readme_commands(text):
    """The shell commands of deploy/README.md's sh blocks, continuation lines joined."""
    cmds = []
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        cur = ""
        for line in block.splitlines():
            line = line.split("#", 1)[0] if not line.lstrip().startswith("#") else ""
            if line.rstrip().endswith("\\"):
                cur += line.rstrip()[:-1] + " "
                continue
            cur += line
            if cur.strip():
                cmds.append(cur.strip())
            cur = ""
    return cmds


def check_manifests():
    try:
        import yaml
        import jsonschema
    except ImportError as e:
        print(f"check_deploy manifests: skipped: {e} (Debian: python3-yaml python3-jsonschema)")
        sys.exit(77)
    schema = json.loads(read("tests/deploy/k8s-schema.json"))
    docs = []
    for path in sorted(glob.glob(os.path.join(ROOT, "deploy/kubernetes/*.yaml"))):
        rel = os.path.relpath(path, ROOT)
        with open(path) as f:
            for i, d in enumerate(yaml.safe_load_all(f)):
                if d is None:
                    continue
                docs.append((rel, d))
                errs = sorted(jsonschema.Draft202012Validator(schema).iter_errors(d), key=lambda e: list(e.path))
                for e in errs[:3]:  # oneOf: the deepest message names the field
                    best = jsonschema.exceptions.best_match([e])
                    problem(f"{rel} document {i + 1} ({d.get('kind')}): {'/'.join(map(str, best.path)) or '(top)'}: {best.message}")
    readme = read("deploy/README.md")
    cmds = readme_commands(readme)
    # ConfigMaps: in the manifests, and made by the README's commands
    cms = {}
    for rel, d in docs:
        if d.get("kind") == "ConfigMap":
            cms[d["metadata"]["name"]] = {"keys": set((d.get("data") or {}).keys()), "files": {}, "by": rel}
    for c in cmds:
        m = re.search(r"kubectl create configmap (\S+)(.*)", c)
        if not m:
            continue
        files = dict(re.findall(r"--from-file=([^=\s]+)=(\S+)", m.group(2)))
        cms[m.group(1)] = {"keys": set(files), "files": files, "by": "deploy/README.md: " + c[:60]}
        if "--dry-run=client -o yaml | kubectl apply -f -" not in c:
            problem(f"deploy/README.md: '{c[:60]}...' is not idempotent (--dry-run=client -o yaml | kubectl apply -f -)")
        applied = [x for x in cmds if re.search(r"kubectl apply -f (deploy/kubernetes/\S+)", x)]
        for a in applied:  # an applied manifest must not hold (and so replace) a ConfigMap the README makes from files
            f = re.search(r"kubectl apply -f (deploy/kubernetes/\S+)", a).group(1)
            for rel, d in docs:
                if rel == f and d.get("kind") == "ConfigMap" and d["metadata"]["name"] == m.group(1):
                    problem(f"{f} holds ConfigMap {m.group(1)}: applying it replaces the one the README made from files")
    namespaces = {d["metadata"]["name"] for _, d in docs if d.get("kind") == "Namespace"}
    for c in cmds:
        m = re.search(r"kubectl create namespace (\S+)", c)
        if m:
            namespaces.add(m.group(1))
    used_ns = {d["metadata"].get("namespace", "default") for _, d in docs if d.get("kind") != "Namespace"}
    if len(used_ns) != 1:
        problem(f"the manifests use several namespaces: {sorted(used_ns)}")
    for ns in used_ns - namespaces - {"default"}:
        problem(f"namespace {ns} is used but no manifest or README command makes it")
    for c in cmds:  # every namespaced kubectl command of the README names the namespace
        if re.search(r"kubectl (create configmap|rollout|get|logs|port-forward|exec)", c) and used_ns and \
                f"-n {next(iter(used_ns))}" not in c and f"--namespace {next(iter(used_ns))}" not in c:
            problem(f"deploy/README.md: '{c[:70]}' does not name the namespace ({next(iter(used_ns))})")
    builds = [re.search(r"docker build -t (\S+)", c).group(1) for c in cmds if re.search(r"docker build -t (\S+)", c)]
    dockerfile = read("Dockerfile")
    env_port = re.search(r"ENV ELDR_PORT=(\d+)", dockerfile)
    if not env_port or f"EXPOSE {env_port.group(1)}" not in dockerfile:
        problem("Dockerfile: ENV ELDR_PORT and EXPOSE disagree (or ELDR_PORT is not set)")
    if "${ELDR_PORT}" not in re.search(r"HEALTHCHECK.*?\n(?:.*\\\n)*.*", dockerfile).group(0):
        problem("Dockerfile: HEALTHCHECK does not ask the port the router listens on (${ELDR_PORT})")
    pods = []
    for rel, d in docs:
        if d.get("kind") != "Deployment":
            continue
        spec, tmpl = d["spec"], d["spec"]["template"]
        labels = tmpl["metadata"].get("labels", {})
        sel = spec["selector"]["matchLabels"]
        if any(labels.get(k) != v for k, v in sel.items()):
            problem(f"{rel}: Deployment {d['metadata']['name']}'s selector {sel} does not match its pods' labels {labels}")
        pods.append((rel, d, labels, tmpl["spec"]))
        ps = tmpl["spec"]
        vols = {v["name"]: v for v in ps.get("volumes", [])}
        for ctr in ps["containers"]:
            pnames = {p.get("name"): p["containerPort"] for p in ctr.get("ports", [])}
            for pr in ("readinessProbe", "livenessProbe"):
                p = ctr.get(pr)
                port = p and (p.get("httpGet") or p.get("tcpSocket"))["port"]
                if isinstance(port, str) and port not in pnames:
                    problem(f"{rel}: {ctr['name']}.{pr} names port {port}, which the container does not have")
            env = {e["name"]: e["value"] for e in ctr.get("env", [])}
            if "ELDR_PORT" in env and int(env["ELDR_PORT"]) not in pnames.values():
                problem(f"{rel}: ELDR_PORT {env['ELDR_PORT']} is not a containerPort {sorted(pnames.values())}")
            ann = tmpl["metadata"].get("annotations", {})
            if "prometheus.io/port" in ann and int(ann["prometheus.io/port"]) not in pnames.values():
                problem(f"{rel}: prometheus.io/port {ann['prometheus.io/port']} is not a containerPort")
            if builds and ctr["image"] not in builds:
                problem(f"{rel}: image {ctr['image']} is not the one deploy/README.md builds ({', '.join(builds)})")
            if ctr.get("imagePullPolicy") == "Always":
                problem(f"{rel}: imagePullPolicy Always pulls {ctr['image']} from a registry")
            # what the container reads: the config, and the artifact the config names
            mounts = {}
            for vm in ctr.get("volumeMounts", []):
                v = vols.get(vm["name"])
                if not v:
                    problem(f"{rel}: volumeMount {vm['name']} has no volume")
                    continue
                mounts[vm["mountPath"].rstrip("/")] = v
                cm = v.get("configMap")
                if cm:
                    have = cms.get(cm["name"])
                    if not have:
                        problem(f"{rel}: ConfigMap {cm['name']} is mounted but no manifest or README command makes it")
                        continue
                    for it in cm.get("items", []):
                        if it["key"] not in have["keys"]:
                            problem(f"{rel}: mounts key {it['key']} of ConfigMap {cm['name']}, which has {sorted(have['keys'])} ({have['by']})")

            def mounted(path):
                d_, f_ = os.path.split(path)
                v = mounts.get(d_)
                cm = v and v.get("configMap")
                if not cm:
                    return None
                items = cm.get("items")
                key = next((it["key"] for it in items if it["path"] == f_), None) if items else f_
                have = cms.get(cm["name"], {"keys": set(), "files": {}})
                return key if key in have["keys"] else None, have["files"].get(key)
            args = ctr.get("args", [])
            cfg_path = args[args.index("--config") + 1] if "--config" in args else None
            shutdown = float(args[args.index("--shutdown-timeout") + 1]) if "--shutdown-timeout" in args else None
            if cfg_path:
                got = mounted(cfg_path)
                if not got or not got[0]:
                    problem(f"{rel}: --config {cfg_path} is not a mounted ConfigMap key")
                elif got[1]:
                    src = os.path.join(ROOT, got[1])
                    if not os.path.exists(src):
                        problem(f"{rel}: {cfg_path} comes from {got[1]}, which does not exist")
                    else:
                        cfg = json.load(open(src))
                        art = cfg.get("artifact")
                        if art and not (mounted(art) or [None])[0]:
                            problem(f"{got[1]}: artifact {art} is not a mounted ConfigMap key")
                        if shutdown is None:
                            shutdown = float(cfg.get("shutdown_timeout", 30))
                        cfg_ns = next(iter(used_ns))
                        check_config_names(cfg, got[1], docs, cfg_ns)
            pre = ctr.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
            pause = float(pre[1]) if len(pre) == 2 and pre[0] == "sleep" else 0
            grace = ps.get("terminationGracePeriodSeconds", 30)
            need = pause + (shutdown if shutdown is not None else 30)
            if grace < need + 5:
                problem(f"{rel}: terminationGracePeriodSeconds {grace} does not cover the preStop pause ({pause:g} s) and "
                        f"the drain (--shutdown-timeout {shutdown:g} s) with 5 s to spare: SIGKILL would cut it")
    for rel, d in docs:
        if d.get("kind") != "Service":
            continue
        sel = d["spec"]["selector"]
        match = [p for p in pods if all(p[2].get(k) == v for k, v in sel.items())]
        if match:
            names = {pp.get("name") for c in match[0][3]["containers"] for pp in c.get("ports", [])}
            for port in d["spec"]["ports"]:
                tp = port.get("targetPort", port["port"])
                if isinstance(tp, str) and tp not in names:
                    problem(f"{rel}: Service {d['metadata']['name']} targets port {tp}, which its pods do not name")
        elif not d["spec"].get("clusterIP") == "None":
            problem(f"{rel}: Service {d['metadata']['name']}'s selector {sel} matches no pod of these manifests")
    # the DNS-discovery config names the headless Services
    for cfgfile in ("deploy/eldr-dns.json",):
        check_config_names(json.loads(read(cfgfile)), cfgfile, docs, next(iter(used_ns)))
    finish("manifests")


def check_config_names(cfg, where, docs, ns):
    """Every worker name of a config is a Service of the manifests."""
    svcs = {(d["metadata"].get("namespace", "default"), d["metadata"]["name"]): d for _, d in docs if d.get("kind") == "Service"}
    for key in ("prefill_dns", "decode_dns"):
        for spec in cfg.get(key, []):
            host, port = spec.rsplit(":", 1)
            parts = host.split(".")
            sns = parts[1] if len(parts) > 1 else ns
            s = svcs.get((sns, parts[0]))
            if not s:
                problem(f"{where}: {key} {spec}: no Service {parts[0]} in namespace {sns}")
            elif int(port) not in [p["port"] for p in s["spec"]["ports"]] or s["spec"].get("clusterIP") != "None":
                problem(f"{where}: {key} {spec}: Service {parts[0]} is not headless on port {port}")
    for key in ("prefill", "decode"):
        for url in cfg.get(key, []):
            m = re.match(r"http://([^:/]+):(\d+)", url)
            if not m:
                continue
            parts = m.group(1).split(".")
            if len(parts) == 2:  # a StatefulSet pod: <pod>.<headless service>, in the router's namespace
                s = svcs.get((ns, parts[1]))
                if not s or s["spec"].get("clusterIP") != "None" or int(m.group(2)) not in [p["port"] for p in s["spec"]["ports"]]:
                    problem(f"{where}: {url}: no headless Service {parts[1]} on port {m.group(2)} in namespace {ns}")


# ---- Docker build context ----------------------------------------------------------------

def dockerignore_patterns():
    pats = []
    for line in read(".dockerignore").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        neg = line.startswith("!")
        p = os.path.normpath(line[1:] if neg else line).lstrip("/")
        pats.append((neg, p))
    return pats


def glob_rx(p):
    """Go's filepath.Match, as Docker uses it, plus **: * and ? stay within
    one path element, ** spans any number of them, [...] is a class."""
    out, i = "", 0
    while i < len(p):
        c = p[i]
        if p.startswith("**", i):
            out += ".*"
            i += 2
            continue
        if c == "*":
            out += "[^/]*"
        elif c == "?":
            out += "[^/]"
        elif c == "[":
            j = p.find("]", i)
            if j < 0:
                out += re.escape(c)
            else:
                out += "[" + p[i + 1:j].replace("^", "\\^") + "]"
                i = j
        else:
            out += re.escape(c)
        i += 1
    return out


def excluded(rel, pats):
    """Docker's rule: the last matching pattern decides; a pattern matches the
    path or any of its parent directories; ** matches any number of them."""
    out = False
    parts = rel.split("/")
    for neg, p in pats:
        rx = "^" + glob_rx(p) + "$"
        for i in range(1, len(parts) + 1):
            if re.match(rx, "/".join(parts[:i])):
                out = not neg
                break
    return out


def context_copy(dst, pats):
    n = 0
    for d, dirs, files in os.walk(ROOT):
        reld = os.path.relpath(d, ROOT)
        reld = "" if reld == "." else reld
        dirs[:] = [x for x in dirs if not (pats and excluded(os.path.join(reld, x), pats))]
        for f in files:
            rel = os.path.join(reld, f)
            if pats and excluded(rel, pats):
                continue
            os.makedirs(os.path.join(dst, reld), exist_ok=True)
            src = os.path.join(ROOT, rel)
            if os.path.islink(src):
                continue
            shutil.copy2(src, os.path.join(dst, rel))
            n += 1
    return n


def configure(src):
    """The Dockerfile's configure step, in a context copy at another path."""
    r = subprocess.run(["cmake", "-S", src, "-B", os.path.join(src, "build"), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release"],
                       capture_output=True, text=True)
    return r.returncode, (r.stdout + r.stderr)


def check_docker_context(build_dir):
    pats = dockerignore_patterns()
    stale = [p for p in glob.glob(os.path.join(ROOT, "build*/CMakeCache.txt"))]
    for must in ("build/CMakeCache.txt", "build-asan/x.o", ".git/config", "build/eldr"):
        if not excluded(must, pats):
            problem(f".dockerignore lets {must} into the image's build context")
    for keep in ("src/serve/conn.c", "CMakeLists.txt", "deploy/eldr.json", "presets", "fuzz/corpus/trace/a.jsonl"):
        if excluded(keep, pats):
            problem(f".dockerignore keeps {keep} out of the build context: the image cannot build")
    with tempfile.TemporaryDirectory(prefix="eldr-docker-ctx-") as tmp:
        ctx = os.path.join(tmp, "src")  # another path than this checkout, as /src in the image
        n = context_copy(ctx, pats)
        rc, out = configure(ctx)
        print(f"docker build context (.dockerignore): {n} files; configure as the Dockerfile does: "
              f"{'ok' if rc == 0 else 'FAILED'}")
        if rc != 0:
            problem("the Dockerfile's configure step fails on the .dockerignore'd context:\n" + out[-800:])
        if stale:  # the failure .dockerignore prevents: shown, so this check can fail
            ctx2 = os.path.join(tmp, "src2")
            os.makedirs(os.path.join(ctx2, "build"))
            shutil.copy2(stale[0], os.path.join(ctx2, "build", "CMakeCache.txt"))
            context_copy(ctx2, [(False, "build*")])
            shutil.copy2(stale[0], os.path.join(ctx2, "build", "CMakeCache.txt"))
            rc2, out2 = configure(ctx2)
            why = next((l for l in out2.splitlines() if "CMakeCache.txt" in l), out2.strip().splitlines()[-1] if out2.strip() else "")
            print(f"without .dockerignore (this checkout's {os.path.relpath(stale[0], ROOT)} copied in): "
                  f"configure {'FAILS' if rc2 else 'works'}: {why.strip()[:120]}")
            if rc2 == 0:
                problem("a stale CMakeCache.txt in the context did not break the configure: this check proves nothing")
        else:
            print("no build tree in this checkout: the failure without .dockerignore is not shown")
    finish("docker-context")


# ---- systemd ------------------------------------------------------------------------------

def unit_fields(text):
    f = {}
    for line in text.splitlines():
        m = re.match(r"^(\w+)=(.*)$", line)
        if m:
            f.setdefault(m.group(1), []).append(m.group(2))
    return f


def wait_port(proc, timeout=20):
    t0 = time.time()
    line = b""
    while time.time() - t0 < timeout:
        c = proc.stdout.read(1)
        if not c:
            break
        line += c
        m = re.search(rb"listening on \S+:(\d+)", line)
        if m and line.endswith(b"\n"):
            return int(m.group(1))
    raise RuntimeError(f"no 'listening on' line: {line[-200:]!r}")


def check_systemd(build_dir):
    unit = read("deploy/systemd/eldr.service")
    f = unit_fields(unit)
    with tempfile.TemporaryDirectory(prefix="eldr-unit-") as prefix:
        r = subprocess.run(["cmake", "--install", build_dir, "--prefix", prefix, "--component", "runtime"],
                           capture_output=True, text=True)
        if r.returncode:
            problem("cmake --install failed: " + r.stderr[-300:])
            finish("systemd")
        for doc in " ".join(f.get("Documentation", [])).split():
            path = doc.replace("file://", "")
            if not path.startswith("/usr/local/"):
                problem(f"Documentation= {doc} is not under the README's install prefix /usr/local")
            elif not os.path.exists(path.replace("/usr/local", prefix, 1)):
                problem(f"Documentation= {doc} does not exist after cmake --install")
        for k in ("StateDirectory", "LogsDirectory"):
            if k not in f:
                problem(f"{k}= missing: with ProtectSystem=strict nothing under /var is writable (--record, the access log)")
        start = f["ExecStart"][0]
        m = re.search(r"--shutdown-timeout (\d+)", start)
        drain = float(m.group(1)) if m else 30
        tso = float(f.get("TimeoutStopSec", ["90"])[0])
        if tso < drain + 5:
            problem(f"TimeoutStopSec {tso:g} does not cover --shutdown-timeout {drain:g} with 5 s to spare")
        etc = os.path.join(prefix, "etc-eldr")
        os.makedirs(etc)
        rewrite = lambda s: s.replace("/usr/local", prefix).replace("/etc/eldr", etc)
        # systemd-analyze verify on the unit as installed (its paths moved to the scratch prefix)
        sa = shutil.which("systemd-analyze")
        if sa:
            moved = os.path.join(prefix, "eldr.service")
            with open(moved, "w") as o:
                o.write(rewrite(unit))
            r = subprocess.run([sa, "verify", moved], capture_output=True, text=True)
            out = (r.stdout + r.stderr).strip()
            print(f"systemd-analyze verify (paths under the scratch prefix): {'ok' if r.returncode == 0 and not out else 'FAILED'}"
                  + (f": {out}" if out else ""))
            if r.returncode or out:  # a warning ("Unknown key ..., ignoring") is a unit that does not say what it means
                problem("systemd-analyze verify: " + out)
        else:
            print("systemd-analyze not installed: the unit's syntax is not verified")
        # the unit's command lines, run as systemd runs them (this machine has no systemd as PID 1)
        procs = []
        try:
            ports = []
            for role in ("prefill", "decode"):
                p = subprocess.Popen([os.path.join(prefix, "bin/eldr"), "worker", "--role", role, "--port", "0",
                                      "--time-scale", "0.01"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
                procs.append(p)
                t0 = time.time()
                line = p.stdout.readline().decode()
                ports.append(int(re.search(r"127\.0\.0\.1:(\d+)", line).group(1)))
            with open(os.path.join(etc, "eldr.json"), "w") as o:
                json.dump({"host": "127.0.0.1", "port": 0, "prefill": [f"http://127.0.0.1:{ports[0]}"],
                           "decode": [f"http://127.0.0.1:{ports[1]}"], "policy": "jsq", "threads": 1}, o)
            pre = rewrite(f["ExecStartPre"][0]).split()
            r = subprocess.run(pre, capture_output=True, text=True)
            print(f"ExecStartPre ({' '.join(f['ExecStartPre'][0].split()[1:])}): exit {r.returncode}: {r.stdout.strip()}")
            if r.returncode:
                problem("ExecStartPre failed: " + r.stderr.strip())
            srv = subprocess.Popen(rewrite(start).split(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            procs.append(srv)
            port = wait_port(srv)
            body = json.dumps({"prompt": "unit run", "max_tokens": 2}).encode()
            req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
            status = urllib.request.urlopen(req, timeout=20).status
            os.kill(srv.pid, signal.SIGHUP)  # ExecReload=/bin/kill -HUP $MAINPID
            time.sleep(0.3)  # the reload is logged; its result is read from the log below
            status2 = urllib.request.urlopen(req, timeout=20).status
            t0 = time.time()
            srv.send_signal(signal.SIGTERM)  # systemctl stop
            rc = srv.wait(timeout=tso)
            log = srv.stderr.read().decode()
            print(f"ExecStart: a request {status}; ExecReload (SIGHUP): {'reloaded' if 'reloaded:' in log else 'NOT reloaded'}, "
                  f"then a request {status2}; SIGTERM (systemctl stop): exit {rc} after {time.time() - t0:.2f} s")
            if status != 200 or status2 != 200 or rc != 0 or "reloaded:" not in log:
                problem("the unit's commands did not run as expected:\n" + log[-600:])
        except Exception as e:  # noqa: BLE001 - reported, not raised
            problem(f"running the unit's commands: {e}")
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
    finish("systemd")


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        sys.exit(2)
    what = sys.argv[1]
    if what == "manifests":
        check_manifests()
    elif what == "docker-context" and len(sys.argv) == 3:
        check_docker_context(sys.argv[2])
    elif what == "systemd" and len(sys.argv) == 3:
        check_systemd(sys.argv[2])
    else:
        print(__doc__)
        sys.exit(2)


if __name__ == "__main__":
    main()
