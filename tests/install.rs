//! Installing: `scripts/run.sh` installs what running needs and nothing of the test suite's
//! (checked on the scripts' own install plan, `WEIR_SETUP_PLAN=1`, as on a machine without any
//! tool), and the Debian package (deploy/debian/build-deb.sh) holds the binary, the config as a
//! conffile, the systemd unit run by the `weir` user, and passes its own config check.

use crate::support;

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// The install plan of `script` on a machine whose PATH has only `tools` (fake executables) and
/// whose home has no Rust: (apt packages, pip packages, whether rustup would run).
fn plan(script: &str, tools: &[&str]) -> (BTreeSet<String>, BTreeSet<String>, bool) {
    let dir = tempfile::tempdir().expect("tempdir");
    let bin = dir.path().join("bin");
    fs::create_dir(&bin).expect("bin dir");
    for tool in tools {
        let path = bin.join(tool);
        fs::write(&path, "#!/bin/sh\nexit 0\n").expect("fake tool");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    let out = Command::new("/bin/bash")
        .arg(repo().join(script))
        .env_clear()
        .env("PATH", &bin)
        .env("HOME", dir.path())
        .env("WEIR_SETUP_PLAN", "1")
        .current_dir(repo())
        .output()
        .unwrap_or_else(|e| panic!("bash {script}: {e}"));
    let said = text(&out);
    assert!(out.status.success(), "{script} in plan mode failed:\n{said}");
    let mut apt = BTreeSet::new();
    let mut pip = BTreeSet::new();
    for line in said.lines() {
        if let Some(names) = line.strip_prefix("setup: would install with apt-get: ") {
            apt.extend(names.split_whitespace().map(String::from));
        } else if let Some(names) = line.strip_prefix("setup: would install with pip: ") {
            pip.extend(names.split_whitespace().map(String::from));
        }
    }
    (apt, pip, said.contains("setup: would install Rust with rustup"))
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

/// What running needs: cmake (Pingora's zlib-ng), a C compiler, and rustup with curl when cargo
/// is missing.
const RUN_NEEDS: &[&str] = &["build-essential", "ca-certificates", "cmake", "curl"];

/// Test-only tools that once came with `scripts/run.sh`.
const TEST_ONLY: &[&str] =
    &["redis-server", "nginx-light", "chromium", "tmux", "python3-grpcio", "pkg-config", "prometheus"];

#[test]
fn run_script_installs_only_what_running_needs() {
    let run = fs::read_to_string(repo().join("scripts/run.sh")).expect("scripts/run.sh");
    let sourced: Vec<&str> = run.lines().filter_map(|l| l.trim().strip_prefix("source ")).collect();
    assert_eq!(sourced, ["scripts/setup-run.sh"], "scripts/run.sh sources the run setup only");

    let (apt, pip, rustup) = plan("scripts/setup-run.sh", &[]);
    assert_eq!(apt, set(RUN_NEEDS), "apt-get list of scripts/setup-run.sh on a bare machine");
    assert!(pip.is_empty(), "no pip package for running: {pip:?}");
    assert!(rustup, "Rust through rustup when cargo is missing");

    // What is there is not installed again.
    let (apt, pip, rustup) = plan("scripts/setup-run.sh", &["cmake", "cc", "cargo"]);
    assert!(apt.is_empty() && pip.is_empty() && !rustup, "{apt:?} {pip:?} rustup={rustup}");
}

#[test]
fn test_setup_adds_the_test_tools_to_the_run_setup() {
    let (apt, pip, rustup) = plan("scripts/setup.sh", &[]);
    assert!(rustup);
    for name in RUN_NEEDS {
        assert!(apt.contains(*name), "scripts/setup.sh installs what running needs too: {name} not in {apt:?}");
    }
    // nginx and python3's grpc module are also found by absolute path, so they may be here already.
    for name in ["redis-server", "tmux", "chromium", "pkg-config", "prometheus"] {
        assert!(apt.contains(name), "scripts/setup.sh installs {name}: {apt:?}");
    }
    assert!(pip.contains("kubernetes-validate"), "{pip:?}");
    let test = fs::read_to_string(repo().join("scripts/test.sh")).expect("scripts/test.sh");
    assert!(test.lines().any(|l| l.trim() == "source scripts/setup.sh"), "scripts/test.sh sources scripts/setup.sh");
    assert!(TEST_ONLY.iter().all(|t| !RUN_NEEDS.contains(t)));
}

/// The package built from the test binary, unpacked: (the .deb, its files, its control files).
struct Package {
    _dir: tempfile::TempDir,
    deb: PathBuf,
    files: PathBuf,
    control: PathBuf,
}

fn build_package() -> Package {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = Command::new("bash")
        .arg(repo().join("deploy/debian/build-deb.sh"))
        .arg(support::weir::bin())
        .arg(dir.path().join("out"))
        .env("WEIR_DEB_COMPRESS", "gzip")
        .output()
        .expect("bash deploy/debian/build-deb.sh");
    assert!(out.status.success(), "build-deb.sh:\n{}", text(&out));
    let deb = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    assert!(deb.is_file(), "build-deb.sh printed {deb:?}, not a file");
    let files = dir.path().join("files");
    let control = dir.path().join("control");
    for (flag, into) in [("-x", &files), ("-e", &control)] {
        let out = Command::new("dpkg-deb").arg(flag).arg(&deb).arg(into).output().expect("dpkg-deb");
        assert!(out.status.success(), "dpkg-deb {flag}:\n{}", text(&out));
    }
    Package { _dir: dir, deb, files, control }
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

#[test]
fn debian_package_installs_binary_config_unit_and_user() {
    let pkg = build_package();
    let name = pkg.deb.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
    assert!(name.starts_with(&format!("weir_{}_", env!("CARGO_PKG_VERSION"))), "{name}");

    let control = read(&pkg.control.join("control"));
    for field in ["Package: weir", &format!("Version: {}", env!("CARGO_PKG_VERSION")), "Depends: libc6 (>= 2."] {
        assert!(control.contains(field), "control has {field:?}:\n{control}");
    }
    assert_eq!(read(&pkg.control.join("conffiles")).trim(), "/etc/weir/routes.toml");
    let postinst = read(&pkg.control.join("postinst"));
    assert!(postinst.contains("useradd --system") && postinst.contains(" weir\n"), "postinst adds the weir user");
    for script in ["postinst", "prerm", "postrm"] {
        let out = Command::new("sh").arg("-n").arg(pkg.control.join(script)).output().expect("sh -n");
        assert!(out.status.success(), "{script} is not valid sh:\n{}", text(&out));
    }

    // The packaged binary runs, says its version, and passes the packaged config.
    let weir = pkg.files.join("usr/bin/weir");
    let version = Command::new(&weir).arg("--version").output().expect("weir --version");
    let said = String::from_utf8_lossy(&version.stdout);
    assert!(said.starts_with(&format!("weir {} (commit ", env!("CARGO_PKG_VERSION"))), "{said}");
    let config = pkg.files.join("etc/weir/routes.toml");
    assert_eq!(read(&config), read(&repo().join("conf/routes.toml")), "the example config is /etc/weir/routes.toml");
    assert_eq!(read(&pkg.files.join("usr/share/weir/weir.schema.json")), read(&repo().join("docs/weir.schema.json")));
    let check = support::weir::run(["check".as_ref(), "-c".as_ref(), config.as_os_str()], Duration::from_secs(30));
    assert_eq!(check.code, Some(0), "weir check of the packaged config:\n{}", check.describe());
    let help = Command::new(&weir).arg("--help").output().expect("weir --help");
    let help = String::from_utf8_lossy(&help.stdout);
    for section in ["Files:", "Signals:", "Environment:", "Exit status:", "/etc/weir/routes.toml"] {
        assert!(help.contains(section), "weir --help has {section:?}:\n{help}");
    }

    // The unit: deploy/weir.service on the packaged paths, run by the package's user.
    let unit = read(&pkg.files.join("lib/systemd/system/weir.service"));
    for line in [
        "ExecStartPre=/usr/bin/weir check -c /etc/weir/routes.toml",
        "ExecStart=/usr/bin/weir -c /etc/weir/routes.toml",
        "ExecReload=/bin/kill -HUP $MAINPID",
        "User=weir",
        "Group=weir",
        "ProtectSystem=strict",
        "NoNewPrivileges=yes",
        "SystemCallFilter=@system-service",
        "SystemCallFilter=~@privileged",
        "ProtectProc=invisible",
        "UMask=0077",
        "MemoryMax=2G",
    ] {
        assert!(unit.lines().any(|l| l == line), "unit has {line:?}:\n{unit}");
    }
    assert!(!unit.contains("DynamicUser") && !unit.contains("/usr/local/"), "{unit}");
    let testable = pkg.files.join("weir.service");
    fs::write(&testable, unit.replace("/usr/bin/weir", "/bin/true")).expect("write the unit to verify");
    match Command::new("systemd-analyze").arg("verify").arg(&testable).output() {
        Err(e) => println!("note: systemd-analyze not run ({e}); the packaged unit was not verified"),
        Ok(out) => assert!(
            out.status.success() && !text(&out).contains("weir.service"),
            "systemd-analyze verify of the packaged unit:\n{}",
            text(&out)
        ),
    }
}
