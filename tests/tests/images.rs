//! The container images and the packaged chart. images/build.sh builds both images without a
//! Docker daemon; their OCI configuration must be what the Dockerfile's final stages declare
//! (user, entrypoint, ports, labels, working directory, volume), their root filesystems hold the
//! binary and what it needs and no shell, the connector image serves AMQP when run from its
//! unpacked root filesystem in a chroot inside a private network namespace (tests/python/
//! image_run.py), the operator image prints its version, README states what each weighs, and
//! every version string of a release agrees. Needs root, as images/build.sh and chroot do.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use serde_json::Value;

/// The crate version every image, chart and default image tag carries.
const VERSION: &str = env!("CARGO_PKG_VERSION");
const TARGETS: [&str; 2] = ["connector", "operator"];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn ok(what: &str, out: Output) -> String {
    assert!(
        out.status.success(),
        "{what}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The folder of the two OCI image layouts, built once for all the tests here.
fn images() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        testkit::built_by(
            &root().join("images/build.sh"),
            &[root().join("target/images").as_os_str()],
        )
    })
}

/// The layout of image `target`.
fn layout(target: &str) -> PathBuf {
    images().join(format!("kubemq-amqp-{target}"))
}

fn blob(layout: &Path, digest: &str) -> Value {
    let hex = digest.strip_prefix("sha256:").expect("a sha256 digest");
    let text = std::fs::read(layout.join("blobs/sha256").join(hex)).expect("blob");
    serde_json::from_slice(&text).expect("a JSON blob")
}

/// The OCI image configuration of `target`, found through its layout's index by the tag
/// [`VERSION`].
fn oci_config(target: &str) -> Value {
    let layout = layout(target);
    let manifest = manifest(target);
    blob(&layout, manifest["config"]["digest"].as_str().unwrap())
}

/// The OCI manifest of `target` tagged [`VERSION`].
fn manifest(target: &str) -> Value {
    let layout = layout(target);
    let index: Value =
        serde_json::from_slice(&std::fs::read(layout.join("index.json")).unwrap()).unwrap();
    let tagged: Vec<&Value> = index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["annotations"]["org.opencontainers.image.ref.name"] == VERSION)
        .collect();
    assert_eq!(tagged.len(), 1, "one manifest tagged {VERSION}: {index}");
    blob(&layout, tagged[0]["digest"].as_str().unwrap())
}

/// `target`'s image unpacked by umoci into a fresh runtime bundle (`rootfs/` and the runtime's
/// `config.json`).
fn unpack(target: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("bundle");
    let image = format!("{}:{VERSION}", layout(target).display());
    let out = Command::new("umoci")
        .args(["unpack", "--image", &image])
        .arg(&bundle)
        .output()
        .expect("umoci runs");
    ok("umoci unpack", out);
    dir
}

/// What the Dockerfile's final stage `target` declares, read independently of images/stage.py.
#[derive(Debug, Default)]
struct Stage {
    user: String,
    entrypoint: Vec<String>,
    exposed: Vec<String>,
    labels: BTreeMap<String, String>,
    workdir: Option<String>,
    volumes: Vec<String>,
    version_default: Option<String>,
}

fn dockerfile_stage(target: &str) -> Stage {
    let text = std::fs::read_to_string(root().join("Dockerfile")).unwrap();
    let joined = text
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n")
        .replace("\\\n", " ");
    let mut stage = Stage::default();
    let mut inside = false;
    for line in joined.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let (keyword, rest) = line.split_once(' ').unwrap_or((line, ""));
        let rest = rest.trim();
        if keyword == "FROM" {
            inside = rest.ends_with(&format!(" AS {target}"));
            continue;
        }
        if !inside {
            continue;
        }
        match keyword {
            "ARG" => stage.version_default = rest.strip_prefix("VERSION=").map(String::from),
            "USER" => stage.user = rest.into(),
            "ENTRYPOINT" => stage.entrypoint = serde_json::from_str(rest).unwrap(),
            "EXPOSE" => stage.exposed = rest.split_whitespace().map(String::from).collect(),
            "WORKDIR" => stage.workdir = Some(rest.into()),
            "VOLUME" => stage.volumes = rest.split_whitespace().map(String::from).collect(),
            "LABEL" => {
                for pair in rest.split("\" ") {
                    let (k, v) = pair.split_once('=').unwrap();
                    let v = v.trim().trim_matches('"');
                    let v = v.replace("${VERSION}", stage.version_default.as_deref().unwrap());
                    stage.labels.insert(k.trim().into(), v);
                }
            }
            _ => {}
        }
    }
    assert!(
        !stage.entrypoint.is_empty(),
        "no stage {target} in the Dockerfile"
    );
    stage
}

fn keys(v: &Value) -> Vec<String> {
    v.as_object()
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default()
}

/// The daemonless images carry exactly the configuration the Dockerfile's final stages declare,
/// run as the non-root user 65532 and say where their source is and under which licence.
#[test]
fn the_images_are_configured_as_the_dockerfile_declares() {
    for target in TARGETS {
        let want = dockerfile_stage(target);
        let image = oci_config(target);
        let c = &image["config"];
        assert_eq!(image["os"], "linux");
        assert_eq!(c["User"], want.user.as_str(), "{target}");
        assert_eq!(
            want.user, "65532:65532",
            "{target} runs as the chart's user"
        );
        assert_eq!(
            c["Entrypoint"],
            serde_json::json!(want.entrypoint),
            "{target}"
        );
        assert!(c["Cmd"].is_null(), "{target} has no default arguments");
        let mut exposed = want.exposed.clone();
        exposed.sort();
        assert_eq!(keys(&c["ExposedPorts"]), exposed, "{target}");
        assert_eq!(keys(&c["Volumes"]), want.volumes, "{target}");
        assert_eq!(
            c["WorkingDir"].as_str().unwrap_or("/"),
            want.workdir.as_deref().unwrap_or("/"),
            "{target}"
        );
        let labels: BTreeMap<String, String> = serde_json::from_value(c["Labels"].clone()).unwrap();
        assert_eq!(labels, want.labels, "{target}");
        assert_eq!(labels["org.opencontainers.image.version"], VERSION);
        assert_eq!(labels["org.opencontainers.image.licenses"], "Apache-2.0");
        assert_eq!(
            labels["org.opencontainers.image.title"],
            format!("kubemq-amqp-{target}")
        );
    }
    let connector = dockerfile_stage("connector");
    // The HTTP port is the one the connector serves by default, and the operator's.
    let settings = connector::config::Settings::default();
    let http = settings.http_address.expect("served by default").port();
    for port in [
        "5672/tcp".to_string(),
        "5671/tcp".into(),
        format!("{http}/tcp"),
    ] {
        assert!(connector.exposed.contains(&port), "{port}");
    }
}

/// Each image holds its binary (symbols kept, debug info dropped), the shared libraries it loads, CA certificates, the users and
/// name-service files; no shell and no package manager; the connector's volume belongs to its
/// user.
#[test]
fn the_images_hold_the_binary_and_what_it_needs_only() {
    for target in TARGETS {
        let dir = unpack(target);
        let rootfs = dir.path().join("bundle/rootfs");
        let binary = rootfs.join(format!("usr/local/bin/kubemq-amqp-{target}"));
        assert!(binary.is_file(), "{target}: no binary");
        let sections = ok(
            "readelf",
            Command::new("readelf")
                .args(["-S", "--wide"])
                .arg(&binary)
                .output()
                .unwrap(),
        );
        assert!(
            sections.contains(".symtab") && !sections.contains(".debug_info"),
            "{target}: the binary keeps its symbols and drops its debug info\n{sections}"
        );
        for file in [
            "etc/passwd",
            "etc/group",
            "etc/nsswitch.conf",
            "etc/ssl/certs/ca-certificates.crt",
            "lib64/ld-linux-x86-64.so.2",
            "lib/x86_64-linux-gnu/libc.so.6",
        ] {
            assert!(rootfs.join(file).is_file(), "{target}: no {file}");
        }
        let passwd = std::fs::read_to_string(rootfs.join("etc/passwd")).unwrap();
        assert!(passwd.contains("nonroot:x:65532:65532:"), "{passwd}");
        let nss = std::fs::read_to_string(rootfs.join("etc/nsswitch.conf")).unwrap();
        assert!(nss.lines().any(|l| l == "hosts: files dns"), "{nss}");
        for absent in [
            "bin/sh",
            "usr/bin/sh",
            "bin/bash",
            "usr/bin/apt",
            "usr/bin/dpkg",
        ] {
            assert!(!rootfs.join(absent).exists(), "{target} has {absent}");
        }
        // Every file is a directory, the binary, a shared library or one of the files above.
        let out = Command::new("find")
            .arg(&rootfs)
            .args(["-type", "f"])
            .output()
            .unwrap();
        for f in ok("find", out).lines() {
            let f = f.strip_prefix(rootfs.to_str().unwrap()).unwrap();
            let known = f.starts_with("/etc/")
                || f.starts_with("/var/lib/dpkg/status.d/")
                || f == format!("/usr/local/bin/kubemq-amqp-{target}")
                || (f.starts_with("/lib") && f.contains(".so"));
            assert!(known, "{target}: unexpected {f}");
        }
    }
    let dir = unpack("connector");
    let volume = dir.path().join("bundle/rootfs/var/lib/kubemq-amqp");
    use std::os::unix::fs::MetadataExt;
    assert_eq!(std::fs::metadata(volume).unwrap().uid(), 65532);
}

/// What a scanner reads: a dpkg status file for every Debian package a library of the image
/// comes from and for the CA bundle's package, each with the version that was copied in.
#[test]
fn the_images_name_the_debian_packages_they_copy() {
    let host_version = |pkg: &str| {
        let out = Command::new("dpkg-query")
            .args(["-W", "-f", "${Version}", pkg])
            .output()
            .unwrap();
        ok("dpkg-query", out)
    };
    for target in TARGETS {
        let dir = unpack(target);
        let rootfs = dir.path().join("bundle/rootfs");
        let status = rootfs.join("var/lib/dpkg/status.d");
        let mut owners = std::collections::BTreeSet::from(["ca-certificates".to_string()]);
        let out = Command::new("find")
            .arg(&rootfs)
            .args(["-type", "f", "-name", "*.so*"])
            .output()
            .unwrap();
        for lib in ok("find", out).lines() {
            let lib = lib.strip_prefix(rootfs.to_str().unwrap()).unwrap();
            let out = Command::new("dpkg").args(["-S", lib]).output().unwrap();
            let owner = ok("dpkg -S", out);
            owners.insert(owner.split(':').next().unwrap().to_string());
        }
        assert!(owners.contains("libc6"), "{target}: {owners:?}");
        let listed: std::collections::BTreeSet<String> = std::fs::read_dir(&status)
            .unwrap_or_else(|e| panic!("{target}: no {}: {e}", status.display()))
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(listed, owners, "{target}: status files");
        for pkg in &owners {
            let text = std::fs::read_to_string(status.join(pkg)).unwrap();
            let field = |k: &str| {
                text.lines()
                    .find_map(|l| l.strip_prefix(&format!("{k}: ")))
                    .unwrap_or_else(|| panic!("{target} {pkg}: no {k}\n{text}"))
                    .to_string()
            };
            assert_eq!(field("Package"), *pkg);
            assert_eq!(field("Version"), host_version(pkg), "{target} {pkg}");
            assert_eq!(field("Status"), "install ok installed");
            assert!(!field("Architecture").is_empty());
        }
    }
}

/// What a scanner reads of the Rust side: each image's binary carries the list of the crates it
/// was built from (cargo-auditable's `.dep-v0` section, zlib-compressed JSON), and that list is
/// Cargo.lock's: every crate from crates.io at a version the lock file pins, its own crate the
/// root at the workspace's version.
#[test]
fn the_images_binaries_list_the_crates_they_are_built_from() {
    let lock = std::fs::read_to_string(root().join("Cargo.lock")).unwrap();
    let locked: std::collections::BTreeSet<(String, String)> = lock
        .split("[[package]]")
        .filter_map(|p| {
            let field = |k: &str| {
                p.lines()
                    .find_map(|l| l.strip_prefix(&format!("{k} = \"")))
                    .map(|v| v.trim_end_matches('"').to_string())
            };
            Some((field("name")?, field("version")?))
        })
        .collect();
    for target in TARGETS {
        let dir = unpack(target);
        let binary = dir
            .path()
            .join(format!("bundle/rootfs/usr/local/bin/kubemq-amqp-{target}"));
        let section = dir.path().join("dep-v0");
        let out = Command::new("objcopy")
            .arg("--dump-section")
            .arg(format!(".dep-v0={}", section.display()))
            .arg(&binary)
            .arg(dir.path().join("scratch"))
            .output()
            .unwrap();
        ok("objcopy --dump-section .dep-v0", out);
        let out = Command::new("python3")
            .args([
                "-c",
                "import sys, zlib; sys.stdout.write(zlib.decompress(open(sys.argv[1], 'rb').read()).decode())",
            ])
            .arg(&section)
            .output()
            .unwrap();
        let list: Value = serde_json::from_str(&ok("zlib", out)).unwrap();
        let packages = list["packages"].as_array().unwrap();
        let name_version = |p: &Value| {
            (
                p["name"].as_str().unwrap().to_string(),
                p["version"].as_str().unwrap().to_string(),
            )
        };
        let root_crate = packages
            .iter()
            .find(|p| p["root"].as_bool() == Some(true))
            .unwrap_or_else(|| panic!("{target}: no root crate in {list}"));
        assert_eq!(
            name_version(root_crate),
            (format!("kubemq-amqp-{target}"), VERSION.to_string())
        );
        let from_crates_io: Vec<_> = packages
            .iter()
            .filter(|p| p["source"] == "crates.io")
            .map(name_version)
            .collect();
        let wanted: &[&str] = match target {
            "connector" => &["tokio", "tonic", "rustls"],
            _ => &["tokio", "kube", "rustls"],
        };
        for wanted in wanted {
            assert!(
                from_crates_io.iter().any(|(n, _)| n == wanted),
                "{target}: {wanted} not listed"
            );
        }
        for crate_version in &from_crates_io {
            assert!(
                locked.contains(crate_version),
                "{target}: {crate_version:?} is not what Cargo.lock pins"
            );
        }
    }
}

/// The connector image runs from its unpacked root filesystem in a chroot, in a private network
/// namespace: it finds KubeMQ by a name from its /etc/hosts (played by the embedded store's
/// gRPC façade, since the real KubeMQ cannot be fetched here), answers /livez and /readyz, and
/// carries a python-qpid-proton send and receive; then it runs on its embedded store as its
/// user, in its volume.
#[test]
fn the_connector_image_serves_amqp_from_a_chroot() {
    let facade = root().join("target/release/kubemq-amqp-connector");
    run_image("connector", facade.to_str().unwrap());
}

/// README's "about N MB compressed" for each image is what its layers weigh as built, to within
/// 1 MB (a pull downloads them compressed).
#[test]
fn readme_states_what_each_image_weighs() {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    for target in TARGETS {
        let row = format!("| `ghcr.io/kubemq-io/kubemq-amqp-{target}:<version>` |");
        let line = readme
            .lines()
            .find(|l| l.starts_with(&row))
            .unwrap_or_else(|| panic!("README has a row for the {target} image"));
        let stated: f64 = line
            .split("about ")
            .nth(1)
            .and_then(|rest| rest.split(" MB compressed").next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("the {target} row says how much: {line}"));
        let layers: u64 = manifest(target)["layers"]
            .as_array()
            .expect("layers")
            .iter()
            .map(|l| l["size"].as_u64().expect("a layer's size"))
            .sum();
        let measured = layers as f64 / 1e6;
        assert!(
            (measured - stated).abs() <= 1.0,
            "the {target} image weighs {measured:.1} MB compressed; README says about {stated}"
        );
    }
}

/// The operator image's entrypoint prints its version.
#[test]
fn the_operator_image_prints_its_version() {
    run_image("operator", VERSION);
}

/// Unpacks image `target` and runs tests/python/image_run.py's check of it, with `arg`, in a
/// private network namespace.
fn run_image(target: &str, arg: &str) {
    let dir = unpack(target);
    let out = Command::new("unshare")
        .arg("-n")
        .arg("python3")
        .arg(root().join("tests/python/image_run.py"))
        .arg(target)
        .arg(dir.path().join("bundle"))
        .arg(arg)
        .output()
        .expect("unshare runs");
    let printed = ok(&format!("image_run.py {target}"), out);
    assert!(printed.trim_end().ends_with("PASS"), "{printed}");
}

/// The value of `key:` in a YAML file of flat `key: value` lines.
fn yaml_field(text: &str, key: &str) -> String {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}:")))
        .map(|v| v.trim().trim_matches('"').to_string())
        .unwrap_or_else(|| panic!("no {key}"))
}

/// One version everywhere a release names it: the crates, the chart's version and appVersion,
/// the Dockerfile's default VERSION in each image stage, the connector image the operator
/// deploys by default, and README's build commands.
#[test]
fn every_version_string_agrees() {
    let chart =
        std::fs::read_to_string(root().join("helm/amqp-connector-operator/Chart.yaml")).unwrap();
    assert_eq!(yaml_field(&chart, "version"), VERSION);
    assert_eq!(yaml_field(&chart, "appVersion"), VERSION);
    for target in TARGETS {
        assert_eq!(
            dockerfile_stage(target).version_default.as_deref(),
            Some(VERSION),
            "the Dockerfile's {target} stage"
        );
    }
    assert_eq!(
        kubemq_amqp_operator::render::DEFAULT_IMAGE,
        format!("ghcr.io/kubemq-io/kubemq-amqp-connector:{VERSION}")
    );
    for krate in ["connector", "operator", "engine", "ops"] {
        let manifest = std::fs::read_to_string(root().join(krate).join("Cargo.toml")).unwrap();
        assert!(
            manifest.contains("version.workspace = true"),
            "{krate} takes the workspace version"
        );
    }
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let builds: Vec<&str> = readme
        .lines()
        .filter(|l| l.trim_start().starts_with("docker build"))
        .collect();
    assert!(!builds.is_empty(), "README shows docker build");
    for b in builds {
        assert!(b.contains(&format!(":{VERSION} ")), "{b}");
    }
    let source = chart
        .lines()
        .skip_while(|l| !l.starts_with("sources:"))
        .nth(1)
        .and_then(|l| l.trim().strip_prefix("- "))
        .expect("the chart names its source");
    for target in TARGETS {
        assert_eq!(
            dockerfile_stage(target).labels["org.opencontainers.image.source"],
            source
        );
    }
}

/// `helm package` makes `amqp-connector-operator-<version>.tgz`, whose appVersion is the crate
/// version and whose operator Deployment runs the operator image of that version.
#[test]
fn the_chart_packages_with_the_crate_version() {
    let helm = std::env::var_os("HELM3").expect("HELM3 names helm 3 (tests/run.sh sets it)");
    let run = |args: &[&std::ffi::OsStr]| {
        let out = Command::new(&helm).args(args).output().unwrap();
        ok(&format!("helm {:?}", args.first()), out)
    };
    let dir = tempfile::tempdir().unwrap();
    let chart = root().join("helm/amqp-connector-operator");
    run(&[
        "package".as_ref(),
        chart.as_os_str(),
        "-d".as_ref(),
        dir.path().as_os_str(),
    ]);
    let tgz = dir
        .path()
        .join(format!("amqp-connector-operator-{VERSION}.tgz"));
    assert!(tgz.is_file(), "no {}", tgz.display());
    let shown = run(&["show".as_ref(), "chart".as_ref(), tgz.as_os_str()]);
    assert_eq!(yaml_field(&shown, "appVersion"), VERSION);
    let rendered = run(&["template".as_ref(), "op".as_ref(), tgz.as_os_str()]);
    let want = format!("ghcr.io/kubemq-io/kubemq-amqp-operator:{VERSION}");
    assert!(
        rendered.lines().any(|l| {
            let l = l.trim();
            l.starts_with("image:") && l.trim_end_matches('"').ends_with(&want)
        }),
        "no {want} in\n{rendered}"
    );
}
