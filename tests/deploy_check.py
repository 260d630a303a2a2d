#!/usr/bin/env python3
"""Checks the deployment files against the echelon binary they launch.

Usage: deploy_check.py HELP_DIR REPO_ROOT ECHELON
HELP_DIR holds `echelon SUB --help` as SUB.help for every subcommand the files may use.

deploy/k8s/*.yaml: every document parses (python3-yaml); the kinds are the expected ones;
every container's command line (the image's entrypoint is echelon) and every `echelon SUB`
inside a shell script names only flags that `echelon SUB --help` lists; the learner listens on
the Service's ports and keeps its run on the StatefulSet's volume claim; every --token-file
lies on a Secret volume, or (actors) on a memory volume an init container fills with the
pod's own token from a Secret the actor never mounts; that init script is run here against
tokens `ECHELON tokens` issues, for two replicas and one too many; no Secret or token is
written into the files.
deploy/slurm/*.sbatch: the same flag check for each `echelon SUB` (bash -n is the caller's).
Prints one line per failure and exits 1 if there was any.
"""
import glob
import os
import re
import shlex
import subprocess
import sys
import tempfile

import yaml

HELP_DIR, ROOT, ECHELON = sys.argv[1], sys.argv[2], sys.argv[3]
failures = []
checked = 0


def fail(msg):
    failures.append(msg)
    print("FAIL: " + msg)


def ok(cond, msg):
    global checked
    checked += 1
    if not cond:
        fail(msg)
    return cond


def help_flags(sub):
    path = os.path.join(HELP_DIR, sub + ".help")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", f.read()))


# `echelon SUB args...` up to the end of its shell command, in a text where backslash-newline
# continuations are joined. Returns [(sub, [tokens])].
INVOCATION = re.compile(r"(?:^|[\s;&|(`\"'])echelon[ \t]+([a-z][a-z-]*)([^\n;&|)]*)")


def invocations(text):
    text = text.replace("\\\n", " ")
    text = "\n".join(re.sub(r"(^|\s)#(\s.*)?$", "", line) for line in text.split("\n"))  # shell comments
    out = []
    for m in INVOCATION.finditer(text):
        rest = m.group(2)
        try:
            tokens = shlex.split(rest, posix=True)
        except ValueError:  # a quote closed after the command ends (bash -c '...'): split loosely
            tokens = rest.replace("'", " ").replace('"', " ").split()
        out.append((m.group(1), tokens))
    return out


def flags_of(tokens):
    return [t.split("=", 1)[0] for t in tokens if t.startswith("--")]


def check_invocation(where, sub, tokens):
    known = help_flags(sub)
    if not ok(known is not None, f"{where}: `echelon {sub}` is not an echelon subcommand"):
        return
    for flag in flags_of(tokens):
        ok(flag in known, f"{where}: `echelon {sub}` has no flag {flag} (not in `echelon {sub} --help`)")


def value_after(tokens, flag):
    for i, t in enumerate(tokens):
        if t == flag and i + 1 < len(tokens):
            return tokens[i + 1]
        if t.startswith(flag + "="):
            return t.split("=", 1)[1]
    return None


TOKENISH = re.compile(r"(token|secret|password|api[_-]?key)", re.I)

def run_init_script(script, mounts, root, pod_name):
    """Runs an init container's script with its mount paths moved under `root`."""
    for m in sorted(mounts, key=lambda m: -len(m["mountPath"])):
        script = script.replace(m["mountPath"], os.path.join(root, m["name"]))
    return subprocess.run(["sh", "-c", script], env={"POD_NAME": pod_name, "PATH": os.environ["PATH"]},
                          capture_output=True, text=True)


def check_own_token(where, workload, pod, container, mount, token_file):
    """Every actor replica presents a token of its own, and sees no other replica's."""
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    if not ok(mount is not None and "emptyDir" in volumes.get(mount["name"], {}),
              f"{where}: --token-file {token_file} is not on a pod-local volume (one token for every replica "
              "makes them one worker: one bad replica's strikes take all of them down)"):
        return
    ok(volumes[mount["name"]]["emptyDir"].get("medium") == "Memory", f"{where}: the token volume is not in memory")
    ok(not any("secret" in volumes.get(m["name"], {}) for m in container.get("volumeMounts", [])),
       f"{where}: the actor mounts a Secret (every replica's tokens)")
    ok(workload["kind"] == "StatefulSet", f"{where}: replicas need stable names to hold tokens of their own")
    ok(pod.get("automountServiceAccountToken") is False, f"{where}: the actor pod mounts a service account token")
    fillers = [ic for ic in pod.get("initContainers", [])
               if any(m["name"] == mount["name"] for m in ic.get("volumeMounts", []))]
    if not ok(len(fillers) == 1, f"{where}: no init container fills the token volume"):
        return
    ic = fillers[0]
    script = ((ic.get("command") or []) + (ic.get("args") or []))[2]
    with tempfile.TemporaryDirectory() as tmp:
        issued = subprocess.run([ECHELON, "tokens", "--out", os.path.join(tmp, "secrets"), "--workers", "2",
                                 "--prefix", workload["metadata"]["name"]], capture_output=True, text=True)
        if not ok(issued.returncode == 0, f"echelon tokens: {issued.stderr.strip()}"):
            return
        secrets = os.path.join(tmp, "secrets")
        for i in range(3):  # two replicas with tokens, and one more without
            pod_name = workload["metadata"]["name"] + "-" + str(i)
            root = os.path.join(tmp, pod_name)
            for m in ic["volumeMounts"]:
                v = volumes[m["name"]]
                os.makedirs(os.path.join(root, m["name"]))
                if "secret" in v:  # what `kubectl create secret --from-file` of each NAME.token holds
                    for f in os.listdir(secrets):
                        if f.endswith(".token"):
                            with open(os.path.join(secrets, f)) as src, open(os.path.join(root, m["name"], f), "w") as dst:
                                dst.write(src.read())
            r = run_init_script(script, ic["volumeMounts"], root, pod_name)
            copied = os.path.join(root, mount["name"], os.path.relpath(token_file, mount["mountPath"]))
            if i < 2:
                with open(os.path.join(secrets, pod_name + ".token")) as f:
                    own = f.read()
                ok(r.returncode == 0 and os.path.exists(copied) and open(copied).read() == own,
                   f"{where}: the init container does not give {pod_name} its own token: {r.stderr.strip()}")
                ok(len(os.listdir(os.path.join(root, mount["name"]))) == 1,
                   f"{where}: the token volume of {pod_name} holds more than its token")
            else:
                ok(r.returncode != 0 and pod_name in r.stderr and "echelon tokens" in r.stderr,
                   f"{where}: a replica without a token ({pod_name}) does not stop naming `echelon tokens`: "
                   f"rc {r.returncode}, {r.stderr.strip()}")


# ---- Kubernetes --------------------------------------------------------------------------
docs = []
for path in sorted(glob.glob(os.path.join(ROOT, "deploy/k8s/*.yaml"))):
    name = os.path.relpath(path, ROOT)
    try:
        with open(path) as f:
            for d in yaml.safe_load_all(f):
                if d is not None:
                    docs.append((name, d))
    except yaml.YAMLError as e:
        fail(f"{name}: does not parse: {e}")
ok(len(docs) > 0, "deploy/k8s holds no manifests")

kinds = {}
for name, d in docs:
    ok(isinstance(d, dict) and "kind" in d and "apiVersion" in d, f"{name}: a document without kind/apiVersion")
    kinds.setdefault(d.get("kind"), []).append((name, d))
for kind in ("StatefulSet", "Service", "Kustomization"):
    ok(kind in kinds, f"deploy/k8s has no {kind}")
ok(set(kinds) <= {"StatefulSet", "Deployment", "Service", "Kustomization", "ConfigMap", "HorizontalPodAutoscaler",
                  "NetworkPolicy", "PodDisruptionBudget"}, f"deploy/k8s: unexpected kinds {sorted(kinds)}")
# Tokens are Secrets created beside these files, never written into them.
ok("Secret" not in kinds, "deploy/k8s defines a Secret: tokens must be created, not committed")
for name, d in kinds.get("Kustomization", []):
    for r in d.get("resources", []):
        ok(os.path.exists(os.path.join(ROOT, "deploy/k8s", r)), f"{name}: resource {r} does not exist")
    ok("secretGenerator" not in d or all("literals" not in g for g in d["secretGenerator"]),
       f"{name}: a secretGenerator with literals inlines a token")

services = {d["metadata"]["name"]: d for _, d in kinds.get("Service", [])}
found = {"learner": 0, "actor": 0}
for kind in ("StatefulSet", "Deployment"):
    for name, d in kinds.get(kind, []):
        spec = d["spec"]
        pod = spec["template"]["spec"]
        ok(spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items(),
           f"{name}: the selector does not match the pod labels")
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        claims = {c["metadata"]["name"] for c in spec.get("volumeClaimTemplates", [])}
        for c in pod["containers"]:
            where = f"{name} {kind} {d['metadata']['name']} container {c['name']}"
            argv = (c.get("command") or ["echelon"]) + (c.get("args") or [])  # entrypoint: echelon
            if argv[0] == "echelon":
                calls = [(argv[1], argv[2:])] if len(argv) > 1 else []
            else:  # a shell script
                calls = invocations("\n".join(argv))
                if os.path.basename(argv[0]) in ("sh", "bash") and len(argv) >= 3 and argv[1] == "-c":
                    syntax = subprocess.run(["bash", "-n", "-c", argv[2]], capture_output=True, text=True)
                    ok(syntax.returncode == 0, f"{where}: bash -n: {syntax.stderr.strip()}")
            ok(calls, f"{where}: runs no `echelon SUB`")
            for ic in pod.get("initContainers", []):
                iargv = (ic.get("command") or []) + (ic.get("args") or [])
                if len(iargv) >= 3 and iargv[1] == "-c":
                    syntax = subprocess.run(["bash", "-n", "-c", iargv[2]], capture_output=True, text=True)
                    ok(syntax.returncode == 0, f"{where}: init container {ic['name']}: bash -n: {syntax.stderr.strip()}")
            for sub, tokens in calls:
                check_invocation(where, sub, tokens)
                if sub in found:
                    found[sub] += 1
            for e in c.get("env", []):
                ok(not (TOKENISH.search(e["name"]) and "value" in e),
                   f"{where}: env {e['name']} carries a literal value; use secretKeyRef")
            mounts = c.get("volumeMounts", [])

            def volume_at(path):
                best = None
                for m in mounts:
                    if path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/"):
                        if best is None or len(m["mountPath"]) > len(best["mountPath"]):
                            best = m
                return best

            ports = {p["containerPort"] for p in c.get("ports", [])}
            for sub, tokens in calls:
                tf = value_after(tokens, "--token-file")
                ok(tf is not None or "--insecure" not in tokens, f"{where}: `echelon {sub}` runs --insecure")
                if sub in ("learner", "actor"):
                    ok(tf is not None, f"{where}: `echelon {sub}` without --token-file")
                if tf is not None and sub == "actor":
                    check_own_token(where, d, pod, c, volume_at(tf), tf)
                elif tf is not None:
                    m = volume_at(tf)
                    ok(m is not None and "secret" in volumes.get(m["name"], {}),
                       f"{where}: --token-file {tf} is not on a Secret volume")
                if sub == "learner":
                    out = value_after(tokens, "--out") or value_after(tokens, "--resume")
                    ok(out is not None, f"{where}: the learner names no run directory (--out/--resume)")
                    listen = value_after(tokens, "--listen") or ""
                    ok(listen.startswith("0.0.0.0:"), f"{where}: the learner must --listen on 0.0.0.0")
                    lport = int(listen.rsplit(":", 1)[1]) if ":" in listen else None
                    mport = value_after(tokens, "--metrics-port")
                    bport = (value_after(tokens, "--broadcast-listen") or ":").rsplit(":", 1)[1]
                    for port in (lport, int(mport) if mport else None, int(bport) if bport else None):
                        ok(port in ports, f"{where}: port {port} is not a containerPort")
                        ok(any(port in {p.get("port") for p in s["spec"]["ports"]} for s in services.values()),
                           f"{where}: port {port} is in no Service")
                if sub == "actor":
                    learner = value_after(tokens, "--learner") or ""
                    host, _, port = learner.rpartition(":")
                    ok(host in services and int(port) in {p["port"] for p in services[host]["spec"]["ports"]},
                       f"{where}: --learner {learner} is not a Service port")
            if kind == "StatefulSet" and any(sub == "learner" for sub, _ in calls):
                run_mounts = [m for m in mounts if m["name"] in claims]
                ok(run_mounts, f"{where}: no volume claim mounted for the run directory")
                for e in c.get("env", []):
                    if e["name"] == "ECHELON_RUN":
                        m = volume_at(e["value"])
                        ok(m is not None and m["name"] in claims, f"{where}: ECHELON_RUN is not on the claim")
                script = "\n".join(argv)
                ok("--resume" in script and "trainer_state.json" in script,
                   f"{where}: a restarted learner does not resume its run")
        for v in volumes.values():
            if "secret" in v:
                ok("secretName" in v["secret"], f"{name}: secret volume {v['name']} names no Secret")
    if kind == "StatefulSet":
        for name, d in kinds.get(kind, []):
            ok(d["spec"].get("serviceName") in services, f"{name}: serviceName is not a Service here")
ok(found["learner"] >= 1, "no container runs `echelon learner`")
ok(found["actor"] >= 1, "no container runs `echelon actor`")
for kind in ("StatefulSet", "Deployment"):
    for name, d in kinds.get(kind, []):
        ok("replicas" in d["spec"], f"{name}: {kind} {d['metadata']['name']} sets no replicas")

# Nothing that looks like a token in any deployment file.
for path in glob.glob(os.path.join(ROOT, "deploy/**/*"), recursive=True):
    if os.path.isfile(path):
        with open(path) as f:
            ok(not re.search(r"\b[0-9a-f]{32,}\b", f.read()), f"{os.path.relpath(path, ROOT)}: holds a token-like string")

# ---- Slurm -------------------------------------------------------------------------------
scripts = sorted(glob.glob(os.path.join(ROOT, "deploy/slurm/*.sbatch")))
ok(scripts, "deploy/slurm holds no .sbatch script")
for path in scripts:
    name = os.path.relpath(path, ROOT)
    with open(path) as f:
        text = f.read()
    calls = invocations(text)
    subs = [s for s, _ in calls]
    ok("learner" in subs and "actor" in subs, f"{name}: needs an `echelon learner` and an `echelon actor`")
    for sub, tokens in calls:
        check_invocation(name, sub, tokens)
        if sub in ("learner", "actor"):
            ok("--token-file" in tokens, f"{name}: `echelon {sub}` without --token-file")
    ok(re.search(r"^#SBATCH\s+--nodes=", text, re.M) is not None, f"{name}: no #SBATCH --nodes")
    ok(len(re.findall(r"^\s*srun\b", text, re.M)) >= 2, f"{name}: learner and actors are not launched by srun")

print(f"deploy_check: {checked} checks, {len(failures)} failed")
sys.exit(1 if failures else 0)
