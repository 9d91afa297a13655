//! A client of the fleet API (the CLI verbs use it): `densevm-api`'s client, one
//! connection per request, with the fleet's typed calls.

use std::path::Path;
use std::time::Duration;

use densevm_api::{ApiClient, ClientError};

use crate::types::{ExecResult, FleetInfo, VmCreate, VmExec, VmInfo, VmPatch};

/// A client of a fleet daemon's socket.
#[derive(Debug, Clone)]
pub struct FleetClient {
    api: ApiClient,
}

fn json(v: &impl serde::Serialize) -> Result<String, ClientError> {
    serde_json::to_string(v).map_err(|e| ClientError::InvalidRequest(e.to_string()))
}

impl FleetClient {
    /// The daemon at `sock` (creates and deletes may take a while: 120 s timeout).
    pub fn new(sock: &Path) -> Self {
        Self {
            api: ApiClient::new(sock).with_timeout(Duration::from_secs(120)),
        }
    }

    /// `GET /`.
    pub fn info(&self) -> Result<FleetInfo, ClientError> {
        self.api.call("GET", "/", None)
    }

    /// `GET /vms`.
    pub fn list(&self) -> Result<Vec<VmInfo>, ClientError> {
        self.api.call("GET", "/vms", None)
    }

    /// `POST /vms`.
    pub fn create(&self, spec: &VmCreate) -> Result<VmInfo, ClientError> {
        self.api.call("POST", "/vms", Some(&json(spec)?))
    }

    /// `GET /vms/{id}`.
    pub fn get(&self, id: &str) -> Result<VmInfo, ClientError> {
        self.api.call("GET", &format!("/vms/{id}"), None)
    }

    /// `PATCH /vms/{id}`.
    pub fn patch(&self, id: &str, patch: &VmPatch) -> Result<VmInfo, ClientError> {
        self.api
            .call("PATCH", &format!("/vms/{id}"), Some(&json(patch)?))
    }

    /// `DELETE /vms/{id}`.
    pub fn delete(&self, id: &str) -> Result<VmInfo, ClientError> {
        self.api.call("DELETE", &format!("/vms/{id}"), None)
    }

    /// `POST /vms/{id}/exec`: runs a command in the guest and waits for its end (up to
    /// its timeout, the default one hour, plus a minute).
    pub fn exec(&self, id: &str, req: &VmExec) -> Result<ExecResult, ClientError> {
        let wait = req
            .timeout_s
            .filter(|t| t.is_finite() && *t > 0.0)
            .map_or(crate::exec::MAX_TIMEOUT, |t| {
                Duration::from_secs_f64(t.min(crate::exec::MAX_TIMEOUT.as_secs_f64()))
            });
        self.api
            .clone()
            .with_timeout(wait + Duration::from_secs(60))
            .call("POST", &format!("/vms/{id}/exec"), Some(&json(req)?))
    }

    /// `GET /metrics` (Prometheus text).
    pub fn metrics(&self) -> Result<String, ClientError> {
        let body = self.api.checked("GET", "/metrics", None)?;
        Ok(String::from_utf8_lossy(&body).into_owned())
    }
}
