//! The deploy files as a policy. The Kubernetes manifests (deploy/kubernetes): each
//! overlay rendered by the real `kubectl kustomize`, its documents parsed and held to
//! what Inlet needs on a platform (a termination grace that covers the drain, routing
//! files mounted as a folder, the plugin cache in a folder of Inlet's own, every
//! `${VAR}` supplied, non-root and read-only, the probes, one replica on SQLite and a
//! migration Job before `--migrate check` instances on PostgreSQL); the routing files
//! in the rendered ConfigMap pass `inlet check`; the PrometheusRule and dashboard are
//! exactly the files under config/; and every built-in kind passes
//! kubernetes-validate's schemas offline. The systemd unit (deploy/systemd): verified
//! and rated by `systemd-analyze`, its stop timeout over the drain, its command line
//! run; the VM routing file passes `inlet check`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use inlet_testkit::paths::plugin_path;
use inlet_testkit::ports::free_port;
use inlet_testkit::process::InletProcess;
use serde_norway::Value;

const OVERLAYS: [&str; 2] = ["postgres", "sqlite"];

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// `kubectl` from `INLET_KUBECTL`, /usr/bin/kubectl or the PATH; missing fails the test.
fn kubectl() -> PathBuf {
    if let Some(p) = std::env::var_os("INLET_KUBECTL").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    let fixed = PathBuf::from("/usr/bin/kubectl");
    if fixed.is_file() {
        return fixed;
    }
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .map(|dir| dir.join("kubectl"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("kubectl not found (/usr/bin/kubectl, PATH, INLET_KUBECTL): tests/deploy.rs renders the manifests with `kubectl kustomize`"))
}

/// The overlay as `kubectl kustomize` renders it: its YAML text and its documents.
fn render(overlay: &str) -> (String, Vec<Value>) {
    let dir = repo().join("deploy/kubernetes/overlays").join(overlay);
    let out = Command::new(kubectl()).arg("kustomize").arg(&dir).output().expect("run kubectl kustomize");
    assert!(
        out.status.success(),
        "kubectl kustomize {} failed: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("kustomize output is UTF-8");
    let docs = serde_norway::Deserializer::from_str(&text)
        .map(|d| <Value as serde::Deserialize>::deserialize(d).expect("a rendered document parses"))
        .filter(|v| !v.is_null())
        .collect::<Vec<_>>();
    assert!(!docs.is_empty(), "{overlay}: kustomize rendered nothing");
    (text, docs)
}

fn s<'a>(v: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(v, |v, k| v.get(*k))
}

fn str_at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a str> {
    s(v, path).and_then(Value::as_str)
}

fn seq<'a>(v: &'a Value, path: &[&str]) -> Vec<&'a Value> {
    s(v, path).and_then(Value::as_sequence).map(|s| s.iter().collect()).unwrap_or_default()
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| str_at(d, &["kind"]) == Some(kind)).collect()
}

fn one<'a>(docs: &'a [Value], kind: &str, overlay: &str) -> &'a Value {
    let found = of_kind(docs, kind);
    assert_eq!(found.len(), 1, "{overlay}: expected exactly one {kind}, found {}", found.len());
    found[0]
}

fn name(v: &Value) -> &str {
    str_at(v, &["metadata", "name"]).unwrap_or("?")
}

fn deployment<'a>(docs: &'a [Value], overlay: &str) -> &'a Value {
    one(docs, "Deployment", overlay)
}

fn pod_spec(workload: &Value) -> &Value {
    s(workload, &["spec", "template", "spec"]).expect("a pod template")
}

/// The container named `inlet` of a Deployment.
fn inlet_container<'a>(docs: &'a [Value], overlay: &str) -> &'a Value {
    seq(pod_spec(deployment(docs, overlay)), &["containers"])
        .into_iter()
        .find(|c| str_at(c, &["name"]) == Some("inlet"))
        .unwrap_or_else(|| panic!("{overlay}: the Deployment has no container `inlet`"))
}

fn args(container: &Value) -> Vec<&str> {
    seq(container, &["args"]).into_iter().map(|a| a.as_str().expect("args are strings")).collect()
}

/// The value after `flag` in `args`; the flag must be there, spelled out.
fn flag<'a>(args: &[&'a str], flag: &str, overlay: &str) -> &'a str {
    let at = args
        .iter()
        .position(|a| *a == flag)
        .unwrap_or_else(|| panic!("{overlay}: the inlet container does not pass {flag} explicitly (args {args:?})"));
    args.get(at + 1).unwrap_or_else(|| panic!("{overlay}: {flag} without a value"))
}

/// Seconds in an Inlet duration (`500ms`, `5s`, `2m`, `1h`), rounded up.
fn seconds(d: &str) -> u64 {
    let split = d.find(|c: char| !c.is_ascii_digit()).unwrap_or(d.len());
    let (n, unit) = d.split_at(split);
    let n: u64 = n.parse().unwrap_or_else(|_| panic!("not a duration: {d}"));
    match unit {
        "ms" => n.div_ceil(1000),
        "s" | "" => n,
        "m" => n * 60,
        "h" => n * 3600,
        _ => panic!("unknown unit in duration {d}"),
    }
}

/// The routing files of the rendered ConfigMap the Deployment mounts as its routes,
/// with that ConfigMap's name and the mount path.
fn routing_files(docs: &[Value], overlay: &str) -> (String, BTreeMap<String, String>) {
    let maps = of_kind(docs, "ConfigMap");
    let cm = maps
        .iter()
        .find(|m| name(m).starts_with("inlet-routes"))
        .unwrap_or_else(|| panic!("{overlay}: no inlet-routes ConfigMap"));
    let data = s(cm, &["data"]).and_then(Value::as_mapping).expect("the routes ConfigMap has data");
    let files = data
        .iter()
        .map(|(k, v)| (k.as_str().unwrap().to_string(), v.as_str().unwrap().to_string()))
        .collect::<BTreeMap<_, _>>();
    assert!(files.keys().all(|k| k.ends_with(".toml")), "{overlay}: routes ConfigMap keys: {:?}", files.keys());
    (name(cm).to_string(), files)
}

/// Every `${NAME}` a routing file reads (`$$` is a literal `$`).
fn env_refs(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let b = text.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'$' && b.get(i + 1) == Some(&b'$') {
            i += 2;
        } else if b[i] == b'$' && b.get(i + 1) == Some(&b'{') {
            let end = text[i..].find('}').map(|e| i + e).expect("an unclosed ${");
            found.insert(text[i + 2..end].to_string());
            i = end + 1;
        } else {
            i += 1;
        }
    }
    found
}

/// Every `${NAME}` the string values of a parsed routing file read (comments read none).
fn toml_env_refs(v: &toml::Value) -> BTreeSet<String> {
    match v {
        toml::Value::String(text) => env_refs(text),
        toml::Value::Array(items) => items.iter().flat_map(toml_env_refs).collect(),
        toml::Value::Table(t) => t.values().flat_map(toml_env_refs).collect(),
        _ => BTreeSet::new(),
    }
}

/// The port of a `listen = "HOST:PORT"` in the table `[table]` of the routing files.
fn listen_port(files: &BTreeMap<String, String>, table: &str) -> u16 {
    for text in files.values() {
        let parsed: toml::Table = text.parse().expect("a routing file is TOML");
        if let Some(listen) = parsed.get(table).and_then(|t| t.get("listen")).and_then(|l| l.as_str()) {
            return listen.rsplit_once(':').and_then(|(_, p)| p.parse().ok()).expect("listen has a port");
        }
    }
    panic!("no [{table}] listen in the routing files");
}

fn container_port(container: &Value, port: &Value) -> u64 {
    if let Some(n) = port.as_u64() {
        return n;
    }
    let wanted = port.as_str().expect("a port is a number or a name");
    seq(container, &["ports"])
        .into_iter()
        .find(|p| str_at(p, &["name"]) == Some(wanted))
        .and_then(|p| s(p, &["containerPort"]).and_then(Value::as_u64))
        .unwrap_or_else(|| panic!("no container port named {wanted}"))
}

/// Every container (init containers too) of a workload, with its pod spec.
fn all_containers(workload: &Value) -> Vec<&Value> {
    let spec = pod_spec(workload);
    seq(spec, &["initContainers"]).into_iter().chain(seq(spec, &["containers"])).collect()
}

/// What holds in both overlays.
fn common_policy(overlay: &str, docs: &[Value]) {
    let dep = deployment(docs, overlay);
    let spec = pod_spec(dep);
    let inlet = inlet_container(docs, overlay);
    let a = args(inlet);
    assert_eq!(a.first(), Some(&"run"), "{overlay}: the inlet container runs `inlet run` ({a:?})");
    assert_eq!(str_at(inlet, &["image"]), Some("inlet:latest"), "{overlay}: image");

    // The termination grace covers the drain: drain delay + grace + 5 s.
    let drain = seconds(flag(&a, "--drain-delay", overlay));
    let grace = seconds(flag(&a, "--grace", overlay));
    let termination = s(spec, &["terminationGracePeriodSeconds"])
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("{overlay}: no terminationGracePeriodSeconds"));
    assert!(
        termination >= drain + grace + 5,
        "{overlay}: terminationGracePeriodSeconds {termination} < --drain-delay {drain} s + --grace {grace} s + 5 s"
    );

    // The routing files: a folder mount of the routes ConfigMap, never subPath, in
    // every workload that mounts it.
    let (routes_cm, files) = routing_files(docs, overlay);
    let volumes = seq(spec, &["volumes"]);
    let volume = |n: &str| volumes.iter().find(|v| str_at(v, &["name"]) == Some(n)).copied();
    for workload in of_kind(docs, "Deployment").into_iter().chain(of_kind(docs, "Job")) {
        let wvolumes = seq(pod_spec(workload), &["volumes"]);
        let route_volumes: Vec<&str> = wvolumes
            .iter()
            .filter(|v| str_at(v, &["configMap", "name"]) == Some(routes_cm.as_str()))
            .filter_map(|v| str_at(v, &["name"]))
            .collect();
        assert!(!route_volumes.is_empty(), "{overlay}: {} does not mount {routes_cm}", name(workload));
        for c in all_containers(workload) {
            for m in seq(c, &["volumeMounts"]) {
                if route_volumes.contains(&str_at(m, &["name"]).unwrap_or("")) {
                    assert!(
                        s(m, &["subPath"]).is_none() && s(m, &["subPathExpr"]).is_none(),
                        "{overlay}: {} mounts the routing ConfigMap with subPath: it would never be updated",
                        name(workload)
                    );
                }
            }
        }
    }
    let routes_dir = flag(&a, "run", overlay);
    let routes_mount = seq(inlet, &["volumeMounts"])
        .into_iter()
        .find(|m| str_at(m, &["mountPath"]) == Some(routes_dir))
        .unwrap_or_else(|| panic!("{overlay}: `inlet run {routes_dir}` is not a mount of the inlet container"));
    let routes_volume = volume(str_at(routes_mount, &["name"]).unwrap()).expect("the routes volume");
    assert_eq!(str_at(routes_volume, &["configMap", "name"]), Some(routes_cm.as_str()), "{overlay}: routes volume");

    // The plugin cache: a folder strictly inside an emptyDir mount (the emptyDir's root
    // is not Inlet's own, so Inlet would refuse it as a cache).
    let cache = Path::new(flag(&a, "--plugin-cache", overlay));
    let holder = seq(inlet, &["volumeMounts"])
        .into_iter()
        .filter(|m| {
            let mp = Path::new(str_at(m, &["mountPath"]).unwrap());
            cache.starts_with(mp) && cache != mp
        })
        .max_by_key(|m| str_at(m, &["mountPath"]).unwrap().len())
        .unwrap_or_else(|| panic!("{overlay}: --plugin-cache {} is not a folder inside a volume mount (a volume's root is not Inlet's own)", cache.display()));
    let holder_volume = volume(str_at(holder, &["name"]).unwrap()).expect("the cache volume");
    assert!(
        s(holder_volume, &["emptyDir"]).is_some(),
        "{overlay}: --plugin-cache {} is not in an emptyDir",
        cache.display()
    );
    assert!(
        seq(inlet, &["volumeMounts"]).iter().all(|m| Path::new(str_at(m, &["mountPath"]).unwrap()) != cache),
        "{overlay}: --plugin-cache is a mount point itself"
    );

    // Every ${VAR} the routing files read is in the container's env.
    let env: BTreeSet<&str> = seq(inlet, &["env"]).into_iter().filter_map(|e| str_at(e, &["name"])).collect();
    assert!(seq(inlet, &["envFrom"]).is_empty(), "{overlay}: name each variable in env, not envFrom");
    for (file, text) in &files {
        let parsed: toml::Table = text.parse().expect("a routing file is TOML");
        for var in toml_env_refs(&toml::Value::Table(parsed)) {
            assert!(
                env.contains(var.as_str()),
                "{overlay}: {file} reads ${{{var}}}, which the inlet container's env does not set"
            );
        }
    }

    // Non-root, read-only, no capabilities, seccomp, for every container of every workload.
    for workload in of_kind(docs, "Deployment").into_iter().chain(of_kind(docs, "Job")) {
        let pspec = pod_spec(workload);
        for c in all_containers(workload) {
            let cname = format!("{overlay}: {}/{}", name(workload), str_at(c, &["name"]).unwrap());
            let either = |path: &[&str]| {
                let mut full = vec!["securityContext"];
                full.extend_from_slice(path);
                s(c, &full).or_else(|| s(pspec, &full)).cloned()
            };
            assert_eq!(either(&["runAsNonRoot"]), Some(Value::Bool(true)), "{cname}: runAsNonRoot");
            assert_eq!(
                s(c, &["securityContext", "readOnlyRootFilesystem"]),
                Some(&Value::Bool(true)),
                "{cname}: readOnlyRootFilesystem"
            );
            assert_eq!(
                s(c, &["securityContext", "allowPrivilegeEscalation"]),
                Some(&Value::Bool(false)),
                "{cname}: allowPrivilegeEscalation"
            );
            let drop: Vec<&str> =
                seq(c, &["securityContext", "capabilities", "drop"]).into_iter().filter_map(Value::as_str).collect();
            assert_eq!(drop, ["ALL"], "{cname}: capabilities.drop");
            assert_eq!(
                either(&["seccompProfile", "type"]).as_ref().and_then(Value::as_str),
                Some("RuntimeDefault"),
                "{cname}: seccompProfile"
            );
            for part in ["requests", "limits"] {
                for res in ["cpu", "memory"] {
                    assert!(s(c, &["resources", part, res]).is_some(), "{cname}: resources.{part}.{res}");
                }
            }
        }
    }
    assert!(
        s(spec, &["securityContext", "runAsUser"]).is_some() && s(spec, &["securityContext", "fsGroup"]).is_some(),
        "{overlay}: the pod sets runAsUser and fsGroup (the volumes' group)"
    );

    // Probes on the admin listener: readiness /readyz (503 while draining), liveness /healthz.
    let admin_port = listen_port(&files, "admin");
    let push_port = listen_port(&files, "server");
    for (probe, path) in [("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")] {
        let get = s(inlet, &[probe, "httpGet"]).unwrap_or_else(|| panic!("{overlay}: no {probe} httpGet"));
        assert_eq!(str_at(get, &["path"]), Some(path), "{overlay}: {probe} path");
        let port = container_port(inlet, s(get, &["port"]).expect("probe port"));
        assert_eq!(port, u64::from(admin_port), "{overlay}: {probe} is not on the admin listener ([admin] listen)");
    }

    // The two Services select the pods and reach the two listeners.
    let labels = s(dep, &["spec", "template", "metadata", "labels"]).and_then(Value::as_mapping).expect("pod labels");
    for (service, port) in [("inlet-push", push_port), ("inlet-admin", admin_port)] {
        let svc = of_kind(docs, "Service")
            .into_iter()
            .find(|v| name(v) == service)
            .unwrap_or_else(|| panic!("{overlay}: no Service {service}"));
        let selector = s(svc, &["spec", "selector"]).and_then(Value::as_mapping).expect("a selector");
        assert!(
            selector.iter().all(|(k, v)| labels.get(k) == Some(v)),
            "{overlay}: {service} does not select the pods"
        );
        let ports = seq(svc, &["spec", "ports"]);
        assert!(
            ports.iter().any(|p| container_port(inlet, s(p, &["targetPort"]).expect("targetPort")) == u64::from(port)),
            "{overlay}: Service {service} does not reach port {port}"
        );
    }
}

#[test]
fn both_overlays_hold_to_the_policy() {
    for overlay in OVERLAYS {
        let (_, docs) = render(overlay);
        common_policy(overlay, &docs);
    }
}

#[test]
fn sqlite_runs_one_instance_on_a_volume() {
    let (_, docs) = render("sqlite");
    let dep = deployment(&docs, "sqlite");
    assert_eq!(s(dep, &["spec", "replicas"]).and_then(Value::as_u64), Some(1), "sqlite: replicas");
    assert_eq!(str_at(dep, &["spec", "strategy", "type"]), Some("Recreate"), "sqlite: never two pods on one file");
    assert!(of_kind(&docs, "PodDisruptionBudget").is_empty(), "sqlite: a PDB over one replica blocks node drains");
    let inlet = inlet_container(&docs, "sqlite");
    assert_eq!(flag(&args(inlet), "--migrate", "sqlite"), "auto");

    // The inbox file is on the PersistentVolumeClaim.
    let pvc = one(&docs, "PersistentVolumeClaim", "sqlite");
    let volume = seq(pod_spec(dep), &["volumes"])
        .into_iter()
        .find(|v| str_at(v, &["persistentVolumeClaim", "claimName"]) == Some(name(pvc)))
        .expect("sqlite: the PVC is a volume of the pod");
    let mount = seq(inlet, &["volumeMounts"])
        .into_iter()
        .find(|m| str_at(m, &["name"]) == str_at(volume, &["name"]))
        .and_then(|m| str_at(m, &["mountPath"]))
        .expect("sqlite: the PVC is mounted");
    let url = seq(inlet, &["env"])
        .into_iter()
        .find(|e| str_at(e, &["name"]) == Some("INLET_DATABASE_URL"))
        .and_then(|e| str_at(e, &["value"]))
        .expect("sqlite: INLET_DATABASE_URL is a literal");
    let file = url.strip_prefix("sqlite://").expect("sqlite: a sqlite:// URL");
    assert!(Path::new(file).starts_with(mount) && file != mount, "sqlite: inbox {file} is not on the PVC ({mount})");
}

#[test]
fn postgres_runs_replicas_after_a_migration_job() {
    let (_, docs) = render("postgres");
    let dep = deployment(&docs, "postgres");
    let replicas = s(dep, &["spec", "replicas"]).and_then(Value::as_u64).expect("postgres: replicas");
    assert!(replicas >= 2, "postgres: replicas {replicas} < 2");
    assert_eq!(str_at(dep, &["spec", "strategy", "type"]), Some("RollingUpdate"));
    let pdb = one(&docs, "PodDisruptionBudget", "postgres");
    assert_eq!(s(pdb, &["spec", "minAvailable"]).and_then(Value::as_u64), Some(1), "postgres: PDB minAvailable");
    let labels = s(dep, &["spec", "template", "metadata", "labels"]).and_then(Value::as_mapping).unwrap();
    let selector = s(pdb, &["spec", "selector", "matchLabels"]).and_then(Value::as_mapping).expect("PDB matchLabels");
    assert!(selector.iter().all(|(k, v)| labels.get(k) == Some(v)), "postgres: the PDB does not select the pods");

    let inlet = inlet_container(&docs, "postgres");
    assert_eq!(flag(&args(inlet), "--migrate", "postgres"), "check");
    let job = one(&docs, "Job", "postgres");
    let migrates = seq(pod_spec(job), &["containers"]).into_iter().any(|c| {
        let line: Vec<&str> =
            seq(c, &["command"]).into_iter().chain(seq(c, &["args"])).filter_map(Value::as_str).collect();
        line.first() == Some(&"inlet")
            && line.get(1) == Some(&"migrate")
            && str_at(c, &["image"]) == str_at(inlet, &["image"])
    });
    assert!(migrates, "postgres: the Job does not run `inlet migrate` with the instances' image");
}

/// Writes the rendered routing files to `dir/routes`, the plugins they name (from
/// plugins/dist) where their paths point, and returns the env the container sets
/// (secret keys given stand-in values).
fn materialize(docs: &[Value], overlay: &str, dir: &Path) -> (PathBuf, Vec<(String, String)>) {
    let (_, files) = routing_files(docs, overlay);
    let routes = dir.join("routes");
    std::fs::create_dir_all(&routes).unwrap();
    for (file, text) in &files {
        std::fs::write(routes.join(file), text).unwrap();
        let parsed: toml::Table = text.parse().unwrap();
        for route in parsed.get("route").and_then(|r| r.as_array()).into_iter().flatten() {
            let plugin =
                route.get("plugin").and_then(|p| p.as_str().or_else(|| p.get("path").and_then(|p| p.as_str())));
            let plugin = plugin.unwrap_or_else(|| panic!("{overlay}: {file}: a route without a plugin path"));
            assert!(!Path::new(plugin).is_absolute(), "{overlay}: {file}: plugin path {plugin} should be relative");
            let stem = Path::new(plugin).file_stem().unwrap().to_str().unwrap();
            let to = routes.join(plugin);
            std::fs::create_dir_all(to.parent().unwrap()).unwrap();
            std::fs::copy(plugin_path(stem), &to).unwrap();
        }
    }
    let env = seq(inlet_container(docs, overlay), &["env"])
        .into_iter()
        .map(|e| {
            let n = str_at(e, &["name"]).unwrap().to_string();
            let value = match (str_at(e, &["value"]), str_at(e, &["valueFrom", "secretKeyRef", "key"])) {
                (Some(v), _) => v.to_string(),
                (None, Some(key)) if key.contains("database-url") => {
                    "postgres://inlet:secret@127.0.0.1:5432/inlet".to_string()
                }
                (None, Some(key)) => format!("stand-in-{key}-0123456789abcdef0123456789abcdef"),
                (None, None) => panic!("{overlay}: env {n} is neither a literal nor a Secret key"),
            };
            (n, value)
        })
        .collect();
    (routes, env)
}

#[test]
fn the_routing_files_pass_inlet_check() {
    for overlay in OVERLAYS {
        let (_, docs) = render(overlay);
        let dir = tempfile::tempdir().unwrap();
        let (routes, env) = materialize(&docs, overlay, dir.path());
        let out = Command::new(env!("CARGO_BIN_EXE_inlet"))
            .arg("check")
            .arg(&routes)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .envs(env)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{overlay}: inlet check refused the rendered routing files:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(!said.contains("warning"), "{overlay}: inlet check warns about the rendered routing files:\n{said}");
    }
}

#[test]
fn monitoring_files_are_generated_from_config() {
    // The committed PrometheusRule is what scripts/render-alerts-rule makes now.
    let out = Command::new(repo().join("scripts/render-alerts-rule")).arg("--stdout").output().unwrap();
    assert!(out.status.success(), "render-alerts-rule: {}", String::from_utf8_lossy(&out.stderr));
    let committed = read(&repo().join("deploy/kubernetes/base/prometheusrule.yaml"));
    assert!(
        String::from_utf8(out.stdout).unwrap() == committed,
        "deploy/kubernetes/base/prometheusrule.yaml is out of date: run scripts/render-alerts-rule"
    );
    let dashboard = read(&repo().join("config/grafana/inlet.json"));
    assert!(
        read(&repo().join("deploy/kubernetes/base/grafana/inlet.json")) == dashboard,
        "deploy/kubernetes/base/grafana/inlet.json is out of date: run scripts/render-alerts-rule"
    );

    let source: Value = serde_norway::from_str(&read(&repo().join("config/alerts/inlet.yml"))).unwrap();
    for overlay in OVERLAYS {
        let (_, docs) = render(overlay);
        let rule = one(&docs, "PrometheusRule", overlay);
        assert_eq!(str_at(rule, &["apiVersion"]), Some("monitoring.coreos.com/v1"));
        assert_eq!(
            s(rule, &["spec", "groups"]),
            s(&source, &["groups"]),
            "{overlay}: the PrometheusRule's groups differ from config/alerts/inlet.yml"
        );
        assert!(!seq(rule, &["spec", "groups"]).is_empty());

        let cm = of_kind(&docs, "ConfigMap")
            .into_iter()
            .find(|m| str_at(m, &["metadata", "labels", "grafana_dashboard"]) == Some("1"))
            .unwrap_or_else(|| panic!("{overlay}: no ConfigMap labelled grafana_dashboard: \"1\""));
        assert_eq!(str_at(cm, &["data", "inlet.json"]), Some(dashboard.as_str()), "{overlay}: dashboard ConfigMap");
    }
}

/// `INLET_K8S_VALIDATE` (scripts/test sets it through scripts/ensure-kubernetes-validate).
fn kubernetes_validate() -> PathBuf {
    match std::env::var_os("INLET_K8S_VALIDATE").filter(|p| !p.is_empty()) {
        Some(p) => PathBuf::from(p),
        None => panic!(
            "INLET_K8S_VALIDATE is not set: run scripts/ensure-kubernetes-validate and export its last line (scripts/test does)"
        ),
    }
}

#[test]
fn rendered_manifests_pass_the_kubernetes_schemas() {
    let validate = kubernetes_validate();
    for overlay in OVERLAYS {
        let (_, docs) = render(overlay);
        // PrometheusRule is a CRD of the Prometheus Operator: kubernetes-validate has
        // schemas for built-in kinds only, so it is left out here (the test above holds
        // it to config/alerts/inlet.yml, and tests/alerts.rs checks the rules with promtool).
        let builtin: Vec<&Value> = docs.iter().filter(|d| str_at(d, &["kind"]) != Some("PrometheusRule")).collect();
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(format!("{overlay}.yaml"));
        let text = builtin.iter().map(|d| serde_norway::to_string(d).unwrap()).collect::<Vec<_>>().join("---\n");
        std::fs::write(&file, text).unwrap();
        // The oldest Kubernetes still commonly run beside the newest the package knows.
        for version in ["1.30", "1.33"] {
            let out = Command::new(&validate).args(["--strict", "-k", version]).arg(&file).output().unwrap();
            let report = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
            assert!(out.status.success(), "{overlay}: kubernetes-validate {version} refused:\n{report}");
            let passed = report.lines().filter(|l| l.contains(" passed for resource ")).count();
            assert_eq!(
                passed,
                builtin.len(),
                "{overlay}: not every document was validated against {version}:\n{report}"
            );
        }
    }
}

/// The unit's `Key=value` lines (continuations joined), in order.
fn unit_settings(text: &str) -> Vec<(String, String)> {
    let joined = text.replace("\\\n", " ");
    joined
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with('['))
        .map(|l| {
            let (k, v) = l.split_once('=').unwrap_or_else(|| panic!("not a setting: {l}"));
            (k.trim().to_string(), v.split_whitespace().collect::<Vec<_>>().join(" "))
        })
        .collect()
}

fn systemd_analyze(args: &[&str]) -> std::process::Output {
    Command::new("systemd-analyze")
        .args(args)
        .output()
        .expect("systemd-analyze (Debian's systemd package) runs: tests/deploy.rs checks the systemd unit with it")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_systemd_unit_verifies_is_sandboxed_and_its_command_line_drains_within_its_stop_timeout() {
    let unit = read(&repo().join("deploy/systemd/inlet.service"));
    let settings = unit_settings(&unit);
    let get = |key: &str| -> Vec<&str> { settings.iter().filter(|(k, _)| k == key).map(|(_, v)| v.as_str()).collect() };
    let exec: Vec<&str> = get("ExecStart")[0].split_whitespace().collect();
    assert_eq!(exec[..3], ["/usr/local/bin/inlet", "run", "/etc/inlet/routes"], "{exec:?}");

    // The stop timeout covers the drain and the grace, with room for the exit.
    let drain = seconds(flag(&exec, "--drain-delay", "systemd"));
    let grace = seconds(flag(&exec, "--grace", "systemd"));
    let stop = seconds(get("TimeoutStopSec")[0]);
    assert!(stop >= drain + grace + 5, "TimeoutStopSec {stop}s < drain {drain}s + grace {grace}s + 5s");
    assert_eq!(get("KillSignal"), ["SIGTERM"]);
    assert!(get("ExecReload")[0].contains("-HUP $MAINPID"), "reload is SIGHUP");
    // wasmtime makes the code it compiles executable: W^X enforcement would kill it.
    assert!(get("MemoryDenyWriteExecute").is_empty(), "MemoryDenyWriteExecute breaks plugin compilation");
    assert_eq!(
        flag(&exec, "--plugin-cache", "systemd"),
        "${CACHE_DIRECTORY}/plugins",
        "the cache in a folder of its own"
    );

    // systemd's own checks, on a copy that names the binary under test.
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("inlet.service");
    std::fs::write(&copy, unit.replace("/usr/local/bin/inlet", env!("CARGO_BIN_EXE_inlet"))).unwrap();
    let copy = copy.to_str().unwrap();
    let out = systemd_analyze(&["verify", copy]);
    let said = String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && said.trim().is_empty(), "systemd-analyze verify: {said}");
    let out = systemd_analyze(&["security", "--offline=true", copy]);
    let report = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "systemd-analyze security: {report}{}", String::from_utf8_lossy(&out.stderr));
    let exposure: f64 = report
        .lines()
        .find_map(|l| l.split_once("Overall exposure level for inlet.service: "))
        .and_then(|(_, v)| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no overall exposure in:\n{report}"));
    assert!(exposure <= 2.0, "exposure {exposure} (systemd's scale: up to 2.0 is OK, 10 is unsandboxed):\n{report}");

    // The command line as systemd runs it, with the folders it makes: a SQLite inbox in
    // the state directory, the plugin cache under the cache directory. It starts,
    // answers /healthz, and a SIGTERM ends it cleanly within the stop timeout.
    let state = dir.path().join("state");
    let cache = dir.path().join("cache");
    let routes = dir.path().join("routes");
    for d in [&state, &cache, &routes] {
        std::fs::create_dir(d).unwrap();
    }
    std::fs::write(
        routes.join("inlet.toml"),
        format!(
            "[store]\nurl = \"sqlite://{}/inbox.db\"\n\n[[route]]\nname = \"wo\"\nplugin = \"{}\"\n\
             source = {{ kind = \"push\" }}\ntarget = {{ kind = \"log\" }}\n",
            state.display(),
            plugin_path("work_order").display()
        ),
    )
    .unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    let cache_arg = format!("{}/plugins", cache.display());
    let mut args: Vec<&str> =
        exec[3..].iter().map(|a| if *a == "${CACHE_DIRECTORY}/plugins" { cache_arg.as_str() } else { a }).collect();
    args.extend(["--listen", &listen]);
    let envs: Vec<(String, String)> = get("Environment")
        .iter()
        .map(|e| e.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())).expect("Environment=KEY=VALUE"))
        .collect();
    let envs: Vec<(&str, &str)> = envs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let mut inlet = InletProcess::spawn_with_args(&routes, &args, &envs);
    inlet.wait_healthy(std::time::Duration::from_secs(60)).await;
    assert!(state.join("inbox.db").is_file(), "the inbox is made in the state directory");
    assert!(cache.join("plugins").is_dir(), "the plugin cache is a folder Inlet made under the cache directory");
    let status = inlet.sigterm_and_wait(std::time::Duration::from_secs(stop));
    assert!(status.success(), "a stop is a clean exit: {status}");
}

#[test]
fn the_vm_routing_file_passes_inlet_check() {
    let dir = tempfile::tempdir().unwrap();
    let routes = dir.path().join("routes");
    let plugins = dir.path().join("plugins");
    std::fs::create_dir_all(&routes).unwrap();
    std::fs::create_dir_all(&plugins).unwrap();
    let file = repo().join("deploy/systemd/routes/inlet.toml");
    std::fs::copy(&file, routes.join("inlet.toml")).unwrap();
    std::fs::copy(plugin_path("work_order"), plugins.join("work_order.wasm")).unwrap();
    // Every ${VAR} the file reads, as /etc/inlet/inlet.env would set it.
    let wanted = toml_env_refs(&toml::Value::Table(read(&file).parse::<toml::Table>().expect("the file is TOML")));
    let given = [
        ("INLET_DATABASE_URL", "postgres://inlet_app:secret@127.0.0.1:5432/inlet"),
        ("INLET_ADMIN_LISTEN", "10.0.0.11:9090"),
        ("INLET_OPS_TOKEN", "stand-in-ops-token-0123456789abcdef0123456789abcdef"),
        ("ORDERS_ENGINE_URL", "http://engine.internal:8080"),
    ];
    assert_eq!(wanted, given.iter().map(|(k, _)| k.to_string()).collect(), "DEPLOY.md names each of these");
    for (var, _) in given {
        assert!(read(&repo().join("DEPLOY.md")).contains(var), "DEPLOY.md says what {var} is");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_inlet"))
        .arg("check")
        .arg(&routes)
        .env_remove("INLET_CONFIG")
        .envs(given)
        .output()
        .expect("run inlet check");
    assert!(
        out.status.success(),
        "inlet check {}: {}{}",
        file.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
