//! Store selection (STORE-1): `COMPOSE_STORE` / `configure(store=...)` forms,
//! parsed once, with the password redacted from everything shown.

use crate::error::{CoreError, CoreResult};

/// Where the store lives.
#[derive(Debug, Clone, PartialEq)]
pub enum StoreUrl {
    Sqlite(String),
    Postgres(PgUrl),
}

#[derive(Debug, Clone, PartialEq)]
pub enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

#[derive(Debug, Clone, PartialEq)]
pub struct PgUrl {
    pub user: Option<String>,
    pub password: Option<String>,
    pub host: String,
    pub port: u16,
    pub dbname: Option<String>,
    pub sslmode: SslMode,
    pub sslrootcert: Option<String>,
    pub schema: String,
    pub pool_size: usize,
    pub application_name: Option<String>,
    /// The URL as given, password shown as `***`.
    pub redacted: String,
}

const FORMS: &str = "accepted forms: unset or empty (SQLite runs.db in COMPOSE_DIR), \
    sqlite:///abs/path.db, sqlite://relative/path.db, \
    postgresql://user:pass@host:port/db or postgres://... with query options sslmode \
    (disable, prefer, require, verify-ca, verify-full), sslrootcert, schema, pool_size, \
    application_name";

/// The URL with any password replaced by `***`; text that is not a URL
/// is returned unchanged.
pub fn redact(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_string();
    };
    let rest = &url[scheme_end + 3..];
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    let Some(at) = authority.rfind('@') else {
        return url.to_string();
    };
    let userinfo = &authority[..at];
    match userinfo.find(':') {
        Some(colon) => format!(
            "{}{}:***{}",
            &url[..scheme_end + 3],
            &userinfo[..colon],
            &rest[at..]
        ),
        None => url.to_string(),
    }
}

fn bad(url: &str, why: &str) -> CoreError {
    CoreError::Config(format!(
        "COMPOSE_STORE '{}' is not a usable store URL ({why}) -- {FORMS}",
        redact(url)
    ))
}

fn percent_decode(url: &str, s: &str) -> CoreResult<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| bad(url, "bad percent-encoding"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| bad(url, "percent-encoding is not UTF-8"))
}

/// Parses a store specification; `default_sqlite` is used when it is empty.
pub fn parse(spec: &str, default_sqlite: &str) -> CoreResult<StoreUrl> {
    let spec = spec.trim();
    if spec.is_empty() {
        return Ok(StoreUrl::Sqlite(default_sqlite.to_string()));
    }
    if let Some(path) = spec.strip_prefix("sqlite://") {
        if path.is_empty() || path == "/" {
            return Err(bad(spec, "no database path"));
        }
        return Ok(StoreUrl::Sqlite(path.to_string()));
    }
    let rest = spec
        .strip_prefix("postgresql://")
        .or_else(|| spec.strip_prefix("postgres://"))
        .ok_or_else(|| bad(spec, "unknown scheme"))?;
    parse_pg(spec, rest).map(StoreUrl::Postgres)
}

fn parse_pg(url: &str, rest: &str) -> CoreResult<PgUrl> {
    let (main, query) = match rest.split_once('?') {
        Some((m, q)) => (m, Some(q)),
        None => (rest, None),
    };
    let (authority, dbname) = match main.split_once('/') {
        Some((a, d)) => (a, (!d.is_empty()).then(|| d.to_string())),
        None => (main, None),
    };
    let (userinfo, hostport) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, authority),
    };
    let (user, password) = match userinfo {
        None => (None, None),
        Some(u) => match u.split_once(':') {
            Some((name, pass)) => (
                Some(percent_decode(url, name)?),
                Some(percent_decode(url, pass)?),
            ),
            None => (Some(percent_decode(url, u)?), None),
        },
    };
    let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
        let (h, after) = v6
            .split_once(']')
            .ok_or_else(|| bad(url, "unclosed '[' in the host"))?;
        (h.to_string(), after.strip_prefix(':'))
    } else {
        match hostport.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), Some(p)),
            None => (hostport.to_string(), None),
        }
    };
    let port = match port {
        None | Some("") => 5432,
        Some(p) => p
            .parse::<u16>()
            .map_err(|_| bad(url, &format!("port '{p}' is not a number")))?,
    };
    let mut out = PgUrl {
        user,
        password,
        host: if host.is_empty() {
            "localhost".into()
        } else {
            percent_decode(url, &host)?
        },
        port,
        dbname: dbname.map(|d| percent_decode(url, &d)).transpose()?,
        sslmode: SslMode::Prefer,
        sslrootcert: None,
        schema: "composeai".into(),
        pool_size: 8,
        application_name: None,
        redacted: redact(url),
    };
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair
            .split_once('=')
            .ok_or_else(|| bad(url, &format!("query option '{pair}' has no value")))?;
        let v = percent_decode(url, v)?;
        match k {
            "sslmode" => {
                out.sslmode = match v.as_str() {
                    "disable" => SslMode::Disable,
                    "prefer" => SslMode::Prefer,
                    "require" => SslMode::Require,
                    "verify-ca" => SslMode::VerifyCa,
                    "verify-full" => SslMode::VerifyFull,
                    _ => return Err(bad(url, &format!("sslmode '{v}' is not supported"))),
                }
            }
            "sslrootcert" => out.sslrootcert = Some(v),
            "schema" => {
                let ok = v
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                    && v.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                    && v.len() <= 63;
                if !ok {
                    return Err(bad(
                        url,
                        &format!("schema '{v}' is not a plain identifier (letters, digits, _)"),
                    ));
                }
                out.schema = v;
            }
            "pool_size" => {
                out.pool_size = v.parse::<usize>().ok().filter(|n| *n >= 1).ok_or_else(|| {
                    bad(url, &format!("pool_size '{v}' is not a positive integer"))
                })?
            }
            "application_name" => out.application_name = Some(v),
            _ => return Err(bad(url, &format!("unknown query option '{k}'"))),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_1_forms_parse_and_passwords_are_redacted() {
        assert_eq!(
            parse("", "/d/runs.db").unwrap(),
            StoreUrl::Sqlite("/d/runs.db".into())
        );
        assert_eq!(
            parse("sqlite:///abs/x.db", "").unwrap(),
            StoreUrl::Sqlite("/abs/x.db".into())
        );
        assert_eq!(
            parse("sqlite://rel/x.db", "").unwrap(),
            StoreUrl::Sqlite("rel/x.db".into())
        );
        let StoreUrl::Postgres(pg) = parse(
            "postgres://bob:s%40cret@db.example:6543/app?sslmode=require&schema=wf&pool_size=3",
            "",
        )
        .unwrap() else {
            panic!("not postgres")
        };
        assert_eq!(pg.user.as_deref(), Some("bob"));
        assert_eq!(pg.password.as_deref(), Some("s@cret"));
        assert_eq!((pg.host.as_str(), pg.port), ("db.example", 6543));
        assert_eq!(pg.dbname.as_deref(), Some("app"));
        assert_eq!(pg.sslmode, SslMode::Require);
        assert_eq!((pg.schema.as_str(), pg.pool_size), ("wf", 3));
        assert!(!pg.redacted.contains("cret"));
        assert!(pg
            .redacted
            .starts_with("postgres://bob:***@db.example:6543/app?"));
    }

    #[test]
    fn store_1_bad_forms_name_compose_store_without_the_password() {
        for url in [
            "mysql://u:hunter2@h/db",
            "postgresql://u:hunter2@h:notaport/db",
            "postgresql://u:hunter2@h/db?sslmode=sometimes",
            "postgresql://u:hunter2@h/db?schema=a;drop",
            "postgresql://u:hunter2@h/db?colour=red",
        ] {
            let e = parse(url, "").unwrap_err().to_string();
            assert!(e.contains("COMPOSE_STORE"), "{e}");
            assert!(e.contains("accepted forms"), "{e}");
            assert!(!e.contains("hunter2"), "{e}");
        }
    }
}
