//! Secret settings kept out of the config file: `server.admin_token_file`, `store.url_file` and
//! `store.password` / `store.password_file` read a file (a mounted Kubernetes Secret, a systemd
//! credential) at every load, so a reload picks up a rotated secret. What is recorded here is
//! where each secret came from — never its value — for `GET /config` and `weir check`.

use std::path::PathBuf;

use super::spanned::Spanned;
use percent_encoding::utf8_percent_encode;
use serde::Serialize;
use sha2::{Digest, Sha256};

use super::error::{ConfigError, Source};
use super::interpolate::EnvUse;
use super::redact::{redact_all, USERINFO};

/// The most a secret file may hold: a token, a password or a key is far smaller; a path that
/// points at something else (a log, a device) is refused rather than read into memory.
pub const MAX_SECRET_FILE: u64 = 64 * 1024;

/// A secret value: `Debug` never prints it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: String) -> Self {
        Secret(value)
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// Where one secret setting's value came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SecretSource {
    /// The setting it fills, e.g. `server.admin_token`.
    pub setting: String,
    /// `"file /run/secrets/token"` or `"config file"`.
    pub from: String,
    /// The file read, when it came from one (watched for changes).
    #[serde(skip)]
    pub file: Option<PathBuf>,
}

/// The secrets of one loaded config: their sources, the `${NAME}` uses, and a digest of every
/// secret value, so a reload after a secret file changed applies it although the text did not.
#[derive(Clone, Default)]
pub struct Secrets {
    pub sources: Vec<SecretSource>,
    pub env: Vec<EnvUse>,
    digest: Sha256,
    /// Values to hide again in error messages (file contents).
    values: Vec<(String, String)>,
    /// Secret files anyone may read (the config's warnings list).
    pub(super) warnings: Vec<String>,
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Secrets").field("sources", &self.sources).field("env", &self.env).finish_non_exhaustive()
    }
}

impl Secrets {
    pub(super) fn new(env: Vec<EnvUse>) -> Self {
        Secrets { env, ..Default::default() }
    }

    /// The files secrets were read from (the config watcher watches them too).
    pub fn files(&self) -> impl Iterator<Item = &PathBuf> {
        self.sources.iter().filter_map(|s| s.file.as_ref())
    }

    /// Whether no secret was read from a file.
    pub fn none_from_files(&self) -> bool {
        self.values.is_empty()
    }

    /// The digest of every secret value read (never the values).
    pub fn fingerprint(&self) -> [u8; 32] {
        self.digest.clone().finalize().into()
    }

    /// `message` with every secret read from a file shown as `<setting>`, in any of the forms an
    /// error may quote it in ([`forms`]).
    pub fn redact(&self, message: &str) -> String {
        let values = self.values.iter().map(|(setting, value)| (format!("<{setting}>"), value.as_str()));
        redact_all(message, values)
    }

    fn record(&mut self, setting: &str, from: String, file: Option<PathBuf>, value: &str) {
        self.digest.update(setting.as_bytes());
        self.digest.update([0]);
        self.digest.update(value.as_bytes());
        self.digest.update([0]);
        if file.is_some() {
            self.values.push((setting.to_string(), value.to_string()));
        }
        self.sources.push(SecretSource { setting: setting.to_string(), from, file });
    }

    /// The value of `setting` given inline (`value`) or as a file (`file`, the `<setting>_file`
    /// spelling), not both; the file is read now, relative to the config's directory, without
    /// its trailing newline. Returned spanned at the setting that gave it.
    pub(super) fn value_or_file(
        &mut self,
        src: &Source<'_>,
        setting: &str,
        value: Option<Spanned<String>>,
        file: Option<Spanned<String>>,
    ) -> Result<Option<Spanned<String>>, ConfigError> {
        match (value, file) {
            (None, None) => Ok(None),
            (Some(_), Some(f)) => {
                Err(src.error_at(&f.span(), format!("{setting}_file: give {setting} or {setting}_file, not both")))
            }
            (Some(v), None) => {
                self.record(setting, "config file".to_string(), None, v.get_ref());
                Ok(Some(v))
            }
            (None, Some(f)) => {
                let path = super::tls::resolve(&super::tls::base_dir(src.file), f.get_ref());
                let bytes = src.outside.read_at_most(&path, MAX_SECRET_FILE).map_err(|e| {
                    src.error_at(&f.span(), format!("{setting}_file: cannot read {}: {e}", path.display()))
                })?;
                let text = String::from_utf8(bytes).map_err(|_| {
                    src.error_at(&f.span(), format!("{setting}_file: {} is not UTF-8 text", path.display()))
                })?;
                let value = text.strip_suffix('\n').map(|t| t.strip_suffix('\r').unwrap_or(t)).unwrap_or(&text);
                if value.is_empty() {
                    return Err(src.error_at(&f.span(), format!("{setting}_file: {} is empty", path.display())));
                }
                if src.outside.world_readable(&path) {
                    self.warnings.push(format!(
                        "{setting}_file: {} is readable by every user of this machine; chmod o-r it (e.g. 0600, or 0640 \
                         with the group weir runs as)",
                        path.display()
                    ));
                }
                self.record(setting, format!("file {}", path.display()), Some(path), value);
                Ok(Some(Spanned::new(f.span(), value.to_string())))
            }
        }
    }
}

/// `url` with `password` as its userinfo (`redis://host` → `redis://:pw@host`); refused when
/// the URL holds credentials already.
pub(super) fn url_with_password(url: &str, password: &str) -> Result<String, String> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err("store.password: the url is not a redis:// URL".to_string());
    };
    let authority = rest.split('/').next().unwrap_or_default();
    if authority.contains('@') {
        return Err("store.password: the url has credentials already; give the password in one place".to_string());
    }
    Ok(format!("{scheme}://:{}@{rest}", utf8_percent_encode(password, USERINFO)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn password_goes_into_the_userinfo() {
        assert_eq!(url_with_password("redis://h:6379/0", "pw").as_deref(), Ok("redis://:pw@h:6379/0"));
        assert_eq!(
            url_with_password("redis+sentinel://a:26379,b/m", "p@s:s/").as_deref(),
            Ok("redis+sentinel://:p%40s%3As%2F@a:26379,b/m")
        );
        assert!(url_with_password("redis://:x@h", "pw").is_err());
        assert!(url_with_password("h:6379", "pw").is_err());
    }

    #[test]
    fn debug_hides_the_secret() {
        assert_eq!(format!("{:?}", Some(Secret::new("hunter2hunter2".into()))), "Some(Secret(<redacted>))");
    }

    #[test]
    fn files_are_read_without_their_newline_and_redacted() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("token");
        std::fs::write(&file, "0123456789abcdef\n").expect("write");
        let conf = dir.path().join("weir.toml").display().to_string();
        let src = Source { file: &conf, text: "a = 'token'\n", outside: &crate::config::Machine };
        let mut secrets = Secrets::default();
        let value = secrets
            .value_or_file(&src, "server.admin_token", None, Some(Spanned::new(4..11, "token".into())))
            .expect("read")
            .expect("some");
        assert_eq!(value.get_ref(), "0123456789abcdef");
        assert_eq!(secrets.files().collect::<Vec<_>>(), [&file]);
        assert_eq!(secrets.redact("bad 0123456789abcdef"), "bad <server.admin_token>");
        // Quotes, backslashes and URL-unsafe characters, in every form a message may hold them.
        std::fs::write(&file, "q\"b\\s p@ss/\u{1}x\n").expect("write");
        let mut secrets = Secrets::default();
        secrets.value_or_file(&src, "store.password", None, Some(Spanned::new(4..11, "token".into()))).expect("read");
        let secret = "q\"b\\s p@ss/\u{1}x";
        for shown in [
            secret.to_string(),
            format!("{secret:?}"),
            serde_json::Value::from(secret).to_string(),
            crate::config::redact::encode(secret, 0),
            format!("redis://:{}@h", utf8_percent_encode(secret, USERINFO)),
        ] {
            let redacted = secrets.redact(&format!("bad {shown} here"));
            assert!(!redacted.contains("p@ss") && !redacted.contains("p%40ss"), "{shown} -> {redacted}");
            assert!(redacted.contains("<store.password>"), "{redacted}");
        }
        std::fs::write(&file, "\n").expect("write");
        let err = Secrets::default()
            .value_or_file(&src, "server.admin_token", None, Some(Spanned::new(4..11, "token".into())))
            .expect_err("empty");
        assert_eq!(err.line, Some(1));
        assert!(err.message.contains("is empty"), "{err}");
    }
}
