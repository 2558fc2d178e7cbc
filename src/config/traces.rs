//! Where spans go: `telemetry.otlp_endpoint`, else `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (as it
//! is), else `OTEL_EXPORTER_OTLP_ENDPOINT` (a base URL), resolved once when the configuration is
//! validated. `otlp` exports to the URL found here and reads none of them.

use std::fmt;

use crate::config::{invalid, ConfigError, Environment};

/// The URL an OTLP/HTTP receiver takes spans at (`http://host:4318/v1/traces`).
#[derive(Clone, PartialEq, Eq)]
pub struct TracesUrl(url::Url);

impl TracesUrl {
    /// The traces URL of a receiver given by its base URL (`http://host:4318` ->
    /// `http://host:4318/v1/traces`; a URL that already ends with `/v1/traces` is kept). Only
    /// `http` is taken.
    pub fn of_base(base: &str) -> Result<Self, String> {
        let url =
            url::Url::parse(base).map_err(|error| format!("{base:?} is not a URL: {error}"))?;
        match url.scheme() {
            "http" => {}
            "https" => {
                return Err(format!(
                    "{base:?}: https is not supported; give the address of a collector on this machine or network over http (the OpenTelemetry Collector's OTLP/HTTP receiver, port 4318), which can forward over TLS"
                ))
            }
            other => {
                return Err(format!(
                    "{base:?}: the scheme must be http, not {other:?}"
                ))
            }
        }
        let trimmed = base.trim_end_matches('/');
        let traces = if trimmed.ends_with("/v1/traces") {
            trimmed.to_owned()
        } else {
            format!("{trimmed}/v1/traces")
        };
        Self::as_given(&traces)
    }

    /// A traces URL as it is given (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`).
    fn as_given(text: &str) -> Result<Self, String> {
        url::Url::parse(text)
            .map(Self)
            .map_err(|error| format!("{text:?} is not a URL: {error}"))
    }

    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }
}

impl fmt::Display for TracesUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for TracesUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.as_str())
    }
}

/// Where spans go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TracesEndpoint {
    /// No collector is named: nothing is exported.
    Off,
    /// Spans are posted to this URL.
    To(TracesUrl),
    /// An `OTEL_EXPORTER_OTLP_*` variable names a collector the daemon cannot use: nothing is
    /// exported, and the daemon says why at start (the variables belong to the environment the
    /// daemon runs in, not to its configuration: a bad one does not stop the daemon, unlike
    /// `telemetry.otlp_endpoint`).
    Unusable(String),
}

impl TracesEndpoint {
    /// `telemetry.otlp_endpoint` when it is set (an error names it), else the environment's
    /// variables.
    pub(super) fn resolve(
        otlp_endpoint: &str,
        environment: &Environment,
    ) -> Result<Self, ConfigError> {
        if !otlp_endpoint.is_empty() {
            return TracesUrl::of_base(otlp_endpoint)
                .map(Self::To)
                .map_err(|error| invalid("telemetry.otlp_endpoint", error));
        }
        let found = if let Some(url) = &environment.otlp_traces_endpoint {
            TracesUrl::as_given(url)
                .map_err(|error| format!("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: {error}"))
        } else if let Some(base) = &environment.otlp_endpoint {
            TracesUrl::of_base(base)
                .map_err(|error| format!("OTEL_EXPORTER_OTLP_ENDPOINT: {error}"))
        } else {
            return Ok(Self::Off);
        };
        Ok(found.map_or_else(Self::Unusable, Self::To))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn traces_url(base: &str) -> Result<String, String> {
        TracesUrl::of_base(base).map(|url| url.as_str().to_owned())
    }

    #[test]
    fn a_base_url_gets_the_traces_path_and_https_is_refused_in_words() {
        assert_eq!(
            traces_url("http://127.0.0.1:4318").unwrap(),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert_eq!(
            traces_url("http://collector:4318/").unwrap(),
            "http://collector:4318/v1/traces"
        );
        assert_eq!(
            traces_url("http://collector:4318/v1/traces").unwrap(),
            "http://collector:4318/v1/traces"
        );
        assert!(traces_url("https://collector:4318")
            .unwrap_err()
            .contains("https is not supported"));
        assert!(traces_url("collector:4318").is_err());
        assert!(traces_url("not a url").is_err());
    }

    #[test]
    fn the_key_comes_first_then_the_traces_variable_then_the_base_variable() {
        let environment = |traces: Option<&str>, base: Option<&str>| Environment {
            otlp_traces_endpoint: traces.map(str::to_owned),
            otlp_endpoint: base.map(str::to_owned),
            ..Environment::default()
        };
        let to = |url: &str| TracesEndpoint::To(TracesUrl::as_given(url).unwrap());
        let both = environment(Some("http://traces:4318/custom"), Some("http://base:4318"));
        assert_eq!(
            TracesEndpoint::resolve("http://key:4318", &both).unwrap(),
            to("http://key:4318/v1/traces")
        );
        assert_eq!(
            TracesEndpoint::resolve("", &both).unwrap(),
            to("http://traces:4318/custom"),
            "the traces variable, as it is"
        );
        assert_eq!(
            TracesEndpoint::resolve("", &environment(None, Some("http://base:4318"))).unwrap(),
            to("http://base:4318/v1/traces")
        );
        assert_eq!(
            TracesEndpoint::resolve("", &environment(None, None)).unwrap(),
            TracesEndpoint::Off
        );
        let error = TracesEndpoint::resolve("https://key:4318", &both)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("telemetry.otlp_endpoint") && error.contains("https is not supported"),
            "{error}"
        );
        let TracesEndpoint::Unusable(reason) =
            TracesEndpoint::resolve("", &environment(None, Some("https://base:4318"))).unwrap()
        else {
            panic!("an https base variable is not used");
        };
        assert!(
            reason.starts_with("OTEL_EXPORTER_OTLP_ENDPOINT: ")
                && reason.contains("https is not supported"),
            "{reason}"
        );
    }
}
