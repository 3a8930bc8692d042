//! Kubernetes: agents as the pods of a StatefulSet, the way Monarch's own
//! operator runs its workers.
//!
//! A cluster named `N` is three objects, all labelled
//! `monarch.pytorch.org/mesh-name=N` and `app.kubernetes.io/name=monarch-worker`
//! (the labels of Monarch's operator):
//!
//! - a Secret `N-token` holding the cluster token, mounted into each pod
//!   as the file `/etc/monarch/token` (and, with `--tls-secret`, the
//!   user's own Secret of TLS files mounted at `/etc/monarch-tls`, K8-6);
//! - a headless Service (`clusterIP: None`) that gives each pod a DNS name,
//!   `N-i.SERVICE.NS.svc.cluster.local`;
//! - a StatefulSet of `replicas` pods `N-0`, `N-1`..., started all at once
//!   (`podManagementPolicy: Parallel`), each running `monarch-host agent` on
//!   port 26600 with a TCP readiness probe, so that a pod is Ready only once
//!   its agent listens.
//!
//! [`manifests`] builds them as typed objects and [`Manifests::render`]
//! prints them as YAML for `kubectl apply -f -`; [`monarch_mesh`] builds the
//! Secret and a `MonarchMesh` resource instead, for clusters that run
//! Monarch's operator (which makes the Service, `N-svc`, and the StatefulSet
//! itself). This crate has no Kubernetes client of its own: [`attach`] and
//! [`down`] speak plain HTTP to `kubectl proxy`, which does TLS and
//! authentication with the user's kubeconfig.
//!
//! [`attach`] lists the mesh's pods and watches them ([`PodWatch`] is the
//! state machine) until ranks `0..replicas` are all Ready, then writes the
//! cluster file that `run --cluster N` reads. [`down`] deletes everything
//! the labels select and removes the cluster file.
//!
//! - K8-1: agents are addressed by DNS name, never by pod IP: a pod that
//!   restarts keeps its name and DNS name but gets a new IP.
//! - K8-2: the token reaches the pods only through the Secret, as a file
//!   (CL-1): never in an argv, an environment variable or the pod spec.
//! - K8-3: readiness is tracked per pod name: a rank counts while its pod
//!   is Ready and not being deleted; once its pod turns unready or is
//!   deleted, the rank counts again only when a pod of that name is Ready.
//! - K8-4: the manifests are a function of the flags and the token: the
//!   same ones print the same bytes.
//! - K8-5: a watch that ends is resumed from the last resourceVersion seen;
//!   one that answers 410 Gone is replaced by a fresh list.
//! - K8-6: with a TLS Secret ([`MeshSpec::tls_secret`]) the agent gets
//!   `--tls-dir` [`TLS_DIR`], where that Secret's `ca.pem`, `host.pem` and
//!   `host.key` (and nothing else of it) are mounted read-only, mode 0400;
//!   it never gets `--insecure` then. Without one it gets `--insecure`.
//! - K8-7: [`attach`] reads whether the agents use TLS from the Ready pods
//!   themselves (their agent's `--tls-dir`), not from a flag, and records
//!   it in the cluster file under [`TLS_SPEC_KEY`]; [`check_controller_tls`]
//!   refuses a controller whose TLS does not match, before any handshake.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetSpec};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EnvVar, EnvVarSource, KeyToPath, ObjectFieldSelector, Pod, PodSpec,
    PodTemplateSpec, Probe, ResourceRequirements, Secret, SecretVolumeSource, Service, ServicePort,
    ServiceSpec, TCPSocketAction, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, WatchEvent};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::Serialize;

use crate::{Agent, CLUSTER_FILE_VERSION, ClusterError, ClusterFile, Placed};

/// The port agents listen on: the one Monarch's operator uses.
pub const PORT: u16 = 26600;
/// The name of that port in the Service and the container.
pub const PORT_NAME: &str = "monarch";
/// The label key whose value names the application.
pub const APP_LABEL: &str = "app.kubernetes.io/name";
/// [`APP_LABEL`]'s value on every object of a cluster.
pub const APP_NAME: &str = "monarch-worker";
/// The label key whose value is the cluster's name.
pub const MESH_LABEL: &str = "monarch.pytorch.org/mesh-name";
/// Where the token Secret is mounted in the pods.
pub const TOKEN_DIR: &str = "/etc/monarch";
/// The Secret's key, and so the file's name under [`TOKEN_DIR`].
pub const TOKEN_KEY: &str = "token";
/// Where the TLS Secret is mounted in the pods: the agent's `--tls-dir`.
/// Beside [`TOKEN_DIR`], not under it: a mount point inside a read-only
/// Secret volume cannot be created by every container runtime.
pub const TLS_DIR: &str = "/etc/monarch-tls";
/// The files a TLS Secret must hold, as `monarch-host certs new` names
/// them (`hyperactor::channel::tls`): the cluster CA, the host
/// certificate, its key. The CA's own key is never mounted.
pub const TLS_KEYS: [&str; 3] = ["ca.pem", "host.pem", "host.key"];
/// The name of the TLS Secret's volume in the pod template.
const TLS_VOLUME: &str = "tls";
/// The key of the cluster file's `spec` that says whether the agents use
/// TLS: `true` or `false` (K8-7).
pub const TLS_SPEC_KEY: &str = "tls";
/// The namespace when none is given.
pub const DEFAULT_NAMESPACE: &str = "default";
/// Where `kubectl proxy` serves the API by default.
pub const DEFAULT_API_SERVER: &str = "http://127.0.0.1:8001";
/// The cluster's DNS domain when none is given.
pub const DEFAULT_CLUSTER_DOMAIN: &str = "cluster.local";
/// The API version of `MonarchMesh` (Monarch's operator 0.2).
pub const MONARCH_MESH_API_VERSION: &str = "monarch.pytorch.org/v1alpha1";

/// The longest cluster name: the StatefulSet controller labels each pod
/// with `controller-revision-hash: NAME-HASH`, and a label value has at
/// most 63 characters.
const MAX_NAME: usize = 52;

/// Which objects a cluster is made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    /// Our own Service (named like the cluster) and StatefulSet.
    Plain,
    /// A `MonarchMesh` resource; Monarch's operator makes the Service
    /// (`NAME-svc`) and the StatefulSet.
    MonarchMesh,
}

impl Flavor {
    /// The name of the headless Service the pods' DNS names hang from.
    pub fn service_name(self, name: &str) -> String {
        match self {
            Flavor::Plain => name.to_string(),
            Flavor::MonarchMesh => format!("{name}-svc"),
        }
    }
}

/// The name of cluster `name`'s token Secret.
pub fn secret_name(name: &str) -> String {
    format!("{name}-token")
}

/// The label selector of cluster `name`'s objects.
pub fn selector(name: &str) -> String {
    format!("{MESH_LABEL}={name}")
}

/// Checks that `name` can name a cluster on Kubernetes: a cluster name
/// (see [`crate::check_name`]) that is also a DNS label, since it names
/// the StatefulSet, the Service and the pods. Monarch's operator allows
/// only lowercase letters and digits in a `MonarchMesh`'s name.
pub fn check_name(name: &str, flavor: Flavor) -> Result<(), ClusterError> {
    crate::check_name(name)?;
    let starts = name.starts_with(|c: char| c.is_ascii_lowercase());
    match flavor {
        Flavor::Plain => {
            let ok = starts
                && name.len() <= MAX_NAME
                && !name.ends_with('-')
                && name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
            match ok {
                true => Ok(()),
                false => Err(ClusterError::Invalid(format!(
                    "`{name}` cannot name a Kubernetes cluster: use 1 to {MAX_NAME} lowercase letters, \
                     digits or `-`, starting with a letter and not ending with `-` (it names the \
                     StatefulSet, the Service and the pods {name}-0, {name}-1...)"
                ))),
            }
        }
        Flavor::MonarchMesh => {
            let ok = starts
                && name.len() <= MAX_NAME
                && name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
            match ok {
                true => Ok(()),
                false => Err(ClusterError::Invalid(format!(
                    "`{name}` cannot name a MonarchMesh: Monarch's operator takes only lowercase \
                     letters and digits, starting with a letter (at most {MAX_NAME} here)"
                ))),
            }
        }
    }
}

/// Checks a namespace name (a DNS label).
pub fn check_namespace(namespace: &str) -> Result<(), ClusterError> {
    match is_dns_label(namespace) {
        true => Ok(()),
        false => Err(ClusterError::Invalid(format!(
            "`{namespace}` is not a Kubernetes namespace: use 1 to 63 lowercase letters, digits \
             or `-`, starting and ending with a letter or digit"
        ))),
    }
}

/// Checks a cluster DNS domain such as `cluster.local`.
pub fn check_cluster_domain(domain: &str) -> Result<(), ClusterError> {
    match domain.len() <= 253 && domain.split('.').all(is_dns_label) {
        true => Ok(()),
        false => Err(ClusterError::Invalid(format!(
            "`{domain}` is not a DNS domain such as `cluster.local`"
        ))),
    }
}

fn is_dns_label(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= 63
        && !text.starts_with('-')
        && !text.ends_with('-')
        && text
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

/// A label's name part, or a value: at most 63 of letters, digits, `-`,
/// `_` and `.`, starting and ending with a letter or digit.
fn is_label_word(text: &str) -> bool {
    let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    text.len() <= 63
        && alnum(text.chars().next())
        && alnum(text.chars().last())
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// Checks the name of a TLS Secret: a DNS-1123 subdomain, as Kubernetes
/// wants of a Secret's name (at most 253 lowercase letters, digits, `-`
/// and `.`, each `.`-separated part starting and ending with a letter or
/// digit).
pub fn check_secret_name(name: &str) -> Result<(), ClusterError> {
    let part = |text: &str| {
        let alnum =
            |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
        alnum(text.chars().next())
            && alnum(text.chars().last())
            && text
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    };
    match name.len() <= 253 && name.split('.').all(part) {
        true => Ok(()),
        false => Err(ClusterError::Invalid(format!(
            "`{name}` is not a Kubernetes Secret name: use at most 253 lowercase \
             letters, digits, `-` or `.`, starting and ending with a letter or digit (for \
             example `train-tls`)"
        ))),
    }
}

/// Parses a `--label KEY=VALUE` and checks it as Kubernetes does (a key
/// is `[PREFIX/]NAME`; the value may be empty). The labels that place a
/// pod in its cluster are refused: they are set already.
pub fn parse_label(text: &str) -> Result<(String, String), ClusterError> {
    let invalid = |why: &str| {
        ClusterError::Invalid(format!(
            "`{text}` is not a label: {why} (for example `kueue.x-k8s.io/queue-name=team-a`)"
        ))
    };
    let (key, value) = text
        .split_once('=')
        .ok_or_else(|| invalid("write KEY=VALUE"))?;
    let (prefix, word) = match key.split_once('/') {
        Some((prefix, word)) => (Some(prefix), word),
        None => (None, key),
    };
    if let Some(prefix) = prefix
        && !(prefix.len() <= 253 && prefix.split('.').all(is_dns_label))
    {
        return Err(invalid(
            "the key's prefix must be a DNS name such as `example.com`",
        ));
    }
    if !is_label_word(word) {
        return Err(invalid(
            "the key's name must be 1 to 63 letters, digits, `-`, `_` or `.`, starting and ending with a letter or digit",
        ));
    }
    if !(value.is_empty() || is_label_word(value)) {
        return Err(invalid(
            "the value must be empty or 1 to 63 letters, digits, `-`, `_` or `.`, starting and ending with a letter or digit",
        ));
    }
    if key == APP_LABEL || key == MESH_LABEL {
        return Err(ClusterError::Invalid(format!(
            "`--label {text}`: `{key}` is set by monarch-host (it selects the cluster's pods)"
        )));
    }
    Ok((key.to_string(), value.to_string()))
}

/// What `k8s manifest` was asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MeshSpec {
    /// The cluster's name.
    pub name: String,
    /// The namespace of every object.
    pub namespace: String,
    /// How many pods (agents).
    pub replicas: u32,
    /// The container image: one with `monarch-host` on its PATH.
    pub image: String,
    /// GPUs per pod (`nvidia.com/gpu` limits), if any.
    pub gpus: Option<u32>,
    /// Extra labels for the StatefulSet and the pods (Kueue's queue name,
    /// for instance).
    pub labels: BTreeMap<String, String>,
    /// The cluster's DNS domain.
    pub cluster_domain: String,
    /// The Secret holding the TLS files [`TLS_KEYS`] the agents use
    /// (K8-6); `None` runs them with `--insecure`.
    pub tls_secret: Option<String>,
}

impl MeshSpec {
    /// Checks every field, with a message that says what to pass instead.
    pub fn check(&self, flavor: Flavor) -> Result<(), ClusterError> {
        check_name(&self.name, flavor)?;
        check_namespace(&self.namespace)?;
        check_cluster_domain(&self.cluster_domain)?;
        if self.replicas == 0 || self.replicas > i32::MAX as u32 {
            return Err(ClusterError::Invalid(format!(
                "--replicas {}: a cluster needs at least one pod",
                self.replicas
            )));
        }
        if self.gpus == Some(0) {
            return Err(ClusterError::Invalid(
                "--gpus 0: leave --gpus out for pods without GPUs".into(),
            ));
        }
        if self.image.trim().is_empty() || self.image.chars().any(char::is_whitespace) {
            return Err(ClusterError::Invalid(format!(
                "--image `{}` is not an image reference such as `registry.example.com/monarch-host:0.1.0`",
                self.image
            )));
        }
        for (key, value) in &self.labels {
            parse_label(&format!("{key}={value}"))?;
        }
        if let Some(tls) = &self.tls_secret {
            check_secret_name(tls)
                .map_err(|e| ClusterError::Invalid(format!("--tls-secret {e}")))?;
            if *tls == secret_name(&self.name) {
                return Err(ClusterError::Invalid(format!(
                    "--tls-secret {tls}: that is the name of the cluster's token Secret, which \
                     `k8s manifest` writes; give the TLS files a Secret of their own (e.g. \
                     `{}-tls`)",
                    self.name
                )));
            }
        }
        Ok(())
    }

    /// The labels that select the cluster's pods.
    fn selector_labels(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (APP_LABEL.to_string(), APP_NAME.to_string()),
            (MESH_LABEL.to_string(), self.name.clone()),
        ])
    }

    /// The selector labels and the user's.
    fn all_labels(&self) -> BTreeMap<String, String> {
        let mut labels = self.labels.clone();
        labels.extend(self.selector_labels());
        labels
    }

    fn meta(&self, name: String, labels: BTreeMap<String, String>) -> ObjectMeta {
        ObjectMeta {
            name: Some(name),
            namespace: Some(self.namespace.clone()),
            labels: Some(labels),
            ..ObjectMeta::default()
        }
    }

    /// The pod template: one container running the agent (K8-1, K8-2).
    fn pod_template(&self, flavor: Flavor) -> PodTemplateSpec {
        let listen = format!(
            "$(POD_NAME).{}.{}.svc.{}:{PORT}",
            flavor.service_name(&self.name),
            self.namespace,
            self.cluster_domain
        );
        let mut command: Vec<String> = [
            "monarch-host",
            "agent",
            "--listen",
            &listen,
            "--token-file",
            &format!("{TOKEN_DIR}/{TOKEN_KEY}"),
            "--node",
            "$(POD_NAME)",
            "--idle-exit",
            "0",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        // K8-6: without a TLS Secret the token and all traffic travel in
        // clear on the cluster network; `k8s manifest` warns of it.
        match self.tls_secret {
            Some(_) => command.extend(["--tls-dir".to_string(), TLS_DIR.to_string()]),
            None => command.push("--insecure".to_string()),
        }
        let mut mounts = vec![VolumeMount {
            name: TOKEN_KEY.into(),
            mount_path: TOKEN_DIR.into(),
            read_only: Some(true),
            ..VolumeMount::default()
        }];
        let mut volumes = vec![secret_volume(
            TOKEN_KEY,
            secret_name(&self.name),
            &[TOKEN_KEY],
        )];
        if let Some(tls) = &self.tls_secret {
            mounts.push(VolumeMount {
                name: TLS_VOLUME.into(),
                mount_path: TLS_DIR.into(),
                read_only: Some(true),
                ..VolumeMount::default()
            });
            volumes.push(secret_volume(TLS_VOLUME, tls.clone(), &TLS_KEYS));
        }
        let agent = Container {
            name: "agent".into(),
            image: Some(self.image.clone()),
            command: Some(command),
            env: Some(vec![EnvVar {
                name: "POD_NAME".into(),
                value_from: Some(EnvVarSource {
                    field_ref: Some(ObjectFieldSelector {
                        field_path: "metadata.name".into(),
                        ..ObjectFieldSelector::default()
                    }),
                    ..EnvVarSource::default()
                }),
                ..EnvVar::default()
            }]),
            ports: Some(vec![ContainerPort {
                container_port: PORT.into(),
                name: Some(PORT_NAME.into()),
                protocol: Some("TCP".into()),
                ..ContainerPort::default()
            }]),
            // Ready means the agent listens, not just that the container runs.
            readiness_probe: Some(Probe {
                tcp_socket: Some(TCPSocketAction {
                    port: IntOrString::Int(PORT.into()),
                    ..TCPSocketAction::default()
                }),
                period_seconds: Some(5),
                ..Probe::default()
            }),
            resources: self.gpus.map(|gpus| ResourceRequirements {
                limits: Some(BTreeMap::from([(
                    "nvidia.com/gpu".to_string(),
                    Quantity(gpus.to_string()),
                )])),
                ..ResourceRequirements::default()
            }),
            volume_mounts: Some(mounts),
            ..Container::default()
        };
        PodTemplateSpec {
            metadata: Some(ObjectMeta {
                labels: Some(self.all_labels()),
                ..ObjectMeta::default()
            }),
            spec: Some(PodSpec {
                containers: vec![agent],
                // Agents never call the API server.
                automount_service_account_token: Some(false),
                volumes: Some(volumes),
                ..PodSpec::default()
            }),
        }
    }

    /// The token Secret (K8-2).
    fn secret(&self, token: &str) -> Secret {
        Secret {
            metadata: self.meta(secret_name(&self.name), self.selector_labels()),
            type_: Some("Opaque".into()),
            data: Some(BTreeMap::from([(
                TOKEN_KEY.to_string(),
                ByteString(token.trim().as_bytes().to_vec()),
            )])),
            ..Secret::default()
        }
    }
}

/// A volume of Secret `secret` holding only `keys`, each a file of its
/// name, mode 0400. A key missing from the Secret keeps the pod from
/// starting (the kubelet reports it), rather than an agent half set up.
fn secret_volume(name: &str, secret: String, keys: &[&str]) -> Volume {
    Volume {
        name: name.into(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(secret),
            items: Some(
                keys.iter()
                    .map(|key| KeyToPath {
                        key: key.to_string(),
                        path: key.to_string(),
                        ..KeyToPath::default()
                    })
                    .collect(),
            ),
            default_mode: Some(0o400),
            ..SecretVolumeSource::default()
        }),
        ..Volume::default()
    }
}

/// The objects of a [`Flavor::Plain`] cluster, in the order to apply them.
#[derive(Debug, Clone, PartialEq)]
pub struct Manifests {
    /// The token.
    pub secret: Secret,
    /// The headless Service.
    pub service: Service,
    /// The agents.
    pub stateful_set: StatefulSet,
}

/// Builds the Secret, Service and StatefulSet of `spec`'s cluster, the
/// Secret holding `token`.
pub fn manifests(spec: &MeshSpec, token: &str) -> Result<Manifests, ClusterError> {
    spec.check(Flavor::Plain)?;
    let service = Service {
        metadata: spec.meta(
            Flavor::Plain.service_name(&spec.name),
            spec.selector_labels(),
        ),
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".into()),
            // The pods' DNS names exist before they are Ready: an agent
            // resolves its own --listen name as it starts.
            publish_not_ready_addresses: Some(true),
            selector: Some(spec.selector_labels()),
            ports: Some(vec![ServicePort {
                name: Some(PORT_NAME.into()),
                port: PORT.into(),
                target_port: Some(IntOrString::Int(PORT.into())),
                protocol: Some("TCP".into()),
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    };
    let stateful_set = StatefulSet {
        metadata: spec.meta(spec.name.clone(), spec.all_labels()),
        spec: Some(StatefulSetSpec {
            replicas: Some(spec.replicas as i32),
            service_name: Some(Flavor::Plain.service_name(&spec.name)),
            pod_management_policy: Some("Parallel".into()),
            selector: LabelSelector {
                match_labels: Some(spec.selector_labels()),
                ..LabelSelector::default()
            },
            template: spec.pod_template(Flavor::Plain),
            ..StatefulSetSpec::default()
        }),
        ..StatefulSet::default()
    };
    Ok(Manifests {
        secret: spec.secret(token),
        service,
        stateful_set,
    })
}

impl Manifests {
    /// The objects as YAML documents separated by `---` (K8-4).
    pub fn render(&self) -> Result<String, ClusterError> {
        Ok([
            yaml(&self.secret)?,
            yaml(&self.service)?,
            yaml(&self.stateful_set)?,
        ]
        .join("---\n"))
    }
}

/// A `MonarchMesh`, the custom resource of Monarch's operator
/// (github.com/meta-pytorch/monarch-kubernetes, `monarch.pytorch.org/v1alpha1`
/// as of operator 0.2: `spec.podTemplate` is a whole PodTemplateSpec).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MonarchMesh {
    /// [`MONARCH_MESH_API_VERSION`].
    pub api_version: String,
    /// `MonarchMesh`.
    pub kind: String,
    /// Its name, namespace and labels; the operator copies the labels to
    /// the StatefulSet (which is where Kueue looks).
    pub metadata: ObjectMeta,
    /// What the operator makes.
    pub spec: MonarchMeshSpec,
}

/// The `spec` of a [`MonarchMesh`].
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MonarchMeshSpec {
    /// How many worker pods.
    pub replicas: i32,
    /// The port the workers listen on.
    pub port: i32,
    /// The pods; the operator adds its selector labels.
    pub pod_template: PodTemplateSpec,
}

/// The objects of a [`Flavor::MonarchMesh`] cluster, in the order to apply
/// them.
#[derive(Debug, Clone, PartialEq)]
pub struct MonarchMeshManifests {
    /// The token (the operator knows nothing of it).
    pub secret: Secret,
    /// The resource the operator turns into a Service and a StatefulSet.
    pub mesh: MonarchMesh,
}

/// Builds the Secret and the `MonarchMesh` of `spec`'s cluster, the
/// Secret holding `token`.
pub fn monarch_mesh(spec: &MeshSpec, token: &str) -> Result<MonarchMeshManifests, ClusterError> {
    spec.check(Flavor::MonarchMesh)?;
    Ok(MonarchMeshManifests {
        secret: spec.secret(token),
        mesh: MonarchMesh {
            api_version: MONARCH_MESH_API_VERSION.into(),
            kind: "MonarchMesh".into(),
            metadata: spec.meta(spec.name.clone(), spec.all_labels()),
            spec: MonarchMeshSpec {
                replicas: spec.replicas as i32,
                port: PORT.into(),
                pod_template: spec.pod_template(Flavor::MonarchMesh),
            },
        },
    })
}

impl MonarchMeshManifests {
    /// The objects as YAML documents separated by `---` (K8-4).
    pub fn render(&self) -> Result<String, ClusterError> {
        Ok([yaml(&self.secret)?, yaml(&self.mesh)?].join("---\n"))
    }
}

fn yaml<T: Serialize>(object: &T) -> Result<String, ClusterError> {
    serde_yaml_ng::to_string(object)
        .map_err(|e| ClusterError::Invalid(format!("cannot write the manifest as YAML: {e}")))
}

/// Where `k8s manifest` got the token its Secret holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    /// The token.
    pub secret: String,
    /// The file it is in.
    pub file: PathBuf,
    /// Whether it was made just now.
    pub made: bool,
}

/// The token for cluster `name`'s Secret: the one in `given`, else the
/// one in `CLUSTERS_DIR/NAME.token`, made there (mode 0600) when missing,
/// so that printing the manifests again does not change the Secret under
/// running pods.
pub fn manifest_token(name: &str, given: Option<&Path>) -> Result<Token, ClusterError> {
    crate::check_name(name)?;
    if let Some(file) = given {
        return Ok(Token {
            secret: read_token(file)?,
            file: file.to_path_buf(),
            made: false,
        });
    }
    let file = default_token_file(name)?;
    if file.exists() {
        return Ok(Token {
            secret: read_token(&file)?,
            file,
            made: false,
        });
    }
    let secret = crate::new_token()?;
    crate::write_atomic(&file, format!("{secret}\n").as_bytes(), 0o600)?;
    Ok(Token {
        secret,
        file,
        made: true,
    })
}

/// `CLUSTERS_DIR/NAME.token`.
pub fn default_token_file(name: &str) -> Result<PathBuf, ClusterError> {
    crate::check_name(name)?;
    Ok(crate::clusters_dir()?.join(format!("{name}.token")))
}

fn read_token(file: &Path) -> Result<String, ClusterError> {
    let text = std::fs::read_to_string(file).map_err(ClusterError::io(format!(
        "reading the token file {}",
        file.display()
    )))?;
    let token = text.trim();
    if token.is_empty() || token.chars().any(char::is_whitespace) {
        return Err(ClusterError::Invalid(format!(
            "the token file {} must hold one token on one line",
            file.display()
        )));
    }
    Ok(token.to_string())
}

/// What one pod of the mesh looks like to [`PodWatch`].
#[derive(Debug, Clone, PartialEq, Eq)]
struct PodState {
    uid: Option<String>,
    ready: bool,
    phase: String,
    why: Option<String>,
    /// `spec.hostname` and `spec.subdomain`: the pod's DNS name.
    hostname: Option<String>,
    subdomain: Option<String>,
    /// Whether its agent was started with a TLS directory (K8-7).
    tls: bool,
}

impl PodState {
    fn of(pod: &Pod) -> PodState {
        let status = pod.status.as_ref();
        let terminating = pod.metadata.deletion_timestamp.is_some();
        let ready = !terminating
            && status
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|conditions| {
                    conditions
                        .iter()
                        .any(|c| c.type_ == "Ready" && c.status == "True")
                });
        let phase = match terminating {
            true => "Terminating".to_string(),
            false => status
                .and_then(|s| s.phase.clone())
                .unwrap_or_else(|| "Pending".into()),
        };
        PodState {
            uid: pod.metadata.uid.clone(),
            ready,
            phase,
            why: (!ready).then(|| why_not_ready(pod)).flatten(),
            hostname: pod.spec.as_ref().and_then(|s| s.hostname.clone()),
            subdomain: pod.spec.as_ref().and_then(|s| s.subdomain.clone()),
            tls: agent_uses_tls(pod),
        }
    }
}

/// Whether the pod's agent container (the one named `agent`, else the
/// first) gets a TLS directory: `--tls-dir` in its command or arguments,
/// or `MONARCH_TLS_DIR` in its environment. An agent without one that
/// listens off loopback runs only with `--insecure`.
fn agent_uses_tls(pod: &Pod) -> bool {
    let Some(spec) = pod.spec.as_ref() else {
        return false;
    };
    let Some(agent) = spec
        .containers
        .iter()
        .find(|c| c.name == "agent")
        .or(spec.containers.first())
    else {
        return false;
    };
    let flag = agent
        .command
        .iter()
        .chain(agent.args.iter())
        .flatten()
        .any(|arg| arg == "--tls-dir" || arg.starts_with("--tls-dir="));
    let env = agent
        .env
        .iter()
        .flatten()
        .filter(|var| var.name == "MONARCH_TLS_DIR")
        .any(|var| var.value_from.is_some() || var.value.as_deref().is_some_and(|v| !v.is_empty()));
    flag || env
}

/// The most telling reason a pod is not Ready: a container's waiting or
/// terminated reason (ContainerCreating, CrashLoopBackOff, ImagePullBackOff),
/// the pod's own, an unschedulable pod's, or the Ready condition's.
fn why_not_ready(pod: &Pod) -> Option<String> {
    let status = pod.status.as_ref()?;
    for container in status.container_statuses.iter().flatten() {
        let state = container.state.as_ref();
        if let Some(reason) = state
            .and_then(|s| s.waiting.as_ref())
            .and_then(|w| w.reason.clone())
        {
            return Some(reason);
        }
        if let Some(reason) = state
            .and_then(|s| s.terminated.as_ref())
            .and_then(|t| t.reason.clone())
        {
            return Some(reason);
        }
        if state.is_some_and(|s| s.running.is_some()) && !container.ready {
            return Some("agent not listening yet".into());
        }
    }
    if let Some(reason) = &status.reason {
        return Some(reason.clone());
    }
    let conditions = status.conditions.iter().flatten();
    let mut unready = None;
    for condition in conditions {
        match (condition.type_.as_str(), condition.status.as_str()) {
            ("PodScheduled", "False") => {
                return Some(condition.reason.clone().unwrap_or("Unschedulable".into()));
            }
            ("Ready", "False") => unready = condition.reason.clone(),
            _ => {}
        }
    }
    unready
}

/// What a watch event asks of the watcher.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Keep reading the stream.
    Continue,
    /// The resourceVersion is too old (410 Gone): list again (K8-5).
    Relist,
    /// The server reported another error; list again after a pause.
    Error(String),
}

/// The readiness of a mesh's ranks, from a pod list and the watch events
/// that follow it (K8-3).
#[derive(Debug, Clone)]
pub struct PodWatch {
    name: String,
    namespace: String,
    replicas: u32,
    cluster_domain: String,
    pods: BTreeMap<String, PodState>,
    resource_version: Option<String>,
}

impl PodWatch {
    /// Watches ranks `0..replicas` of cluster `name` in `namespace`.
    pub fn new(name: &str, namespace: &str, replicas: u32, cluster_domain: &str) -> PodWatch {
        PodWatch {
            name: name.to_string(),
            namespace: namespace.to_string(),
            replicas,
            cluster_domain: cluster_domain.to_string(),
            pods: BTreeMap::new(),
            resource_version: None,
        }
    }

    /// Starts over from a list: its pods and its resourceVersion.
    pub fn relist(&mut self, list: k8s_openapi::List<Pod>) {
        self.pods.clear();
        for pod in &list.items {
            self.upsert(pod);
        }
        self.resource_version = list.metadata.resource_version;
    }

    /// The resourceVersion to watch from.
    pub fn resource_version(&self) -> Option<&str> {
        self.resource_version.as_deref()
    }

    /// Takes one watch event.
    pub fn apply(&mut self, event: WatchEvent<Pod>) -> Next {
        match event {
            WatchEvent::Added(pod) | WatchEvent::Modified(pod) => {
                self.note_version(&pod);
                self.upsert(&pod);
            }
            WatchEvent::Deleted(pod) => {
                self.note_version(&pod);
                if let Some(name) = &pod.metadata.name {
                    // Only the pod that was deleted: a newer one of the
                    // same name may have been added already.
                    let same = self
                        .pods
                        .get(name)
                        .is_some_and(|known| known.uid.is_none() || known.uid == pod.metadata.uid);
                    if same {
                        self.pods.remove(name);
                    }
                }
            }
            WatchEvent::Bookmark {
                resource_version, ..
            } => self.resource_version = Some(resource_version),
            WatchEvent::ErrorStatus(status) if status.code == Some(410) => return Next::Relist,
            WatchEvent::ErrorStatus(status) => {
                return Next::Error(format!(
                    "{} ({})",
                    status.message.unwrap_or_default(),
                    status.code.unwrap_or_default()
                ));
            }
            WatchEvent::ErrorOther(other) => return Next::Error(other.0.to_string()),
        }
        Next::Continue
    }

    fn note_version(&mut self, pod: &Pod) {
        if let Some(version) = &pod.metadata.resource_version {
            self.resource_version = Some(version.clone());
        }
    }

    fn upsert(&mut self, pod: &Pod) {
        if let Some(name) = &pod.metadata.name {
            self.pods.insert(name.clone(), PodState::of(pod));
        }
    }

    fn rank_names(&self) -> impl Iterator<Item = String> + '_ {
        (0..self.replicas).map(|rank| format!("{}-{rank}", self.name))
    }

    /// How many ranks have a Ready pod.
    pub fn ready(&self) -> u32 {
        self.rank_names()
            .filter(|name| self.pods.get(name).is_some_and(|p| p.ready))
            .count() as u32
    }

    /// Whether every rank has a Ready pod.
    pub fn all_ready(&self) -> bool {
        self.ready() == self.replicas
    }

    /// `2/4 pods ready (N-1 Pending: ContainerCreating, N-3 missing)`.
    pub fn progress(&self) -> String {
        let waiting: Vec<String> = self
            .rank_names()
            .filter_map(|name| match self.pods.get(&name) {
                Some(pod) if pod.ready => None,
                Some(pod) => Some(match &pod.why {
                    Some(why) => format!("{name} {}: {why}", pod.phase),
                    None => format!("{name} {}", pod.phase),
                }),
                None => Some(format!("{name} missing")),
            })
            .collect();
        let mut line = format!("{}/{} pods ready", self.ready(), self.replicas);
        if !waiting.is_empty() {
            let shown = waiting.len().min(3);
            line += &format!(" ({}", waiting[..shown].join(", "));
            if waiting.len() > shown {
                line += &format!(", and {} more", waiting.len() - shown);
            }
            line += ")";
        }
        line
    }

    /// Whether the agents of the Ready ranks use TLS (K8-7); an error if
    /// some do and some do not (a rollout between manifests half done).
    pub fn tls(&self) -> Result<bool, ClusterError> {
        let (with, without): (Vec<String>, Vec<String>) = self
            .rank_names()
            .filter(|name| self.pods.get(name).is_some_and(|p| p.ready))
            .partition(|name| self.pods.get(name).is_some_and(|p| p.tls));
        match (with.first(), without.first()) {
            (Some(tls), Some(plain)) => Err(ClusterError::Invalid(format!(
                "the pods of `{}` disagree on TLS: {tls}'s agent has --tls-dir, {plain}'s has \
                 not; wait until `kubectl rollout status -n {} statefulset/{}` says the rollout \
                 is done, then attach again",
                self.name, self.namespace, self.name
            ))),
            (Some(_), None) => Ok(true),
            (None, _) => Ok(false),
        }
    }

    /// The agents, rank by rank, by DNS name (K8-1), once all are Ready.
    pub fn agents(&self) -> Result<Vec<Agent>, ClusterError> {
        self.rank_names()
            .map(|name| {
                let pod = self
                    .pods
                    .get(&name)
                    .filter(|p| p.ready)
                    .ok_or_else(|| ClusterError::Invalid(format!("pod {name} is not Ready")))?;
                let subdomain = pod.subdomain.as_deref().ok_or_else(|| {
                    ClusterError::Invalid(format!(
                        "pod {name} has no spec.subdomain, so no DNS name: its StatefulSet needs \
                         `serviceName` set to a headless Service (as `k8s manifest` makes)"
                    ))
                })?;
                let host = pod.hostname.as_deref().unwrap_or(&name);
                Ok(Agent {
                    addr: format!(
                        "{host}.{subdomain}.{}.svc.{}:{PORT}",
                        self.namespace, self.cluster_domain
                    ),
                    node: name,
                })
            })
            .collect()
    }
}

/// What `k8s attach` was asked for.
#[derive(Debug, Clone)]
pub struct AttachOptions {
    /// The cluster's name.
    pub name: String,
    /// Its namespace.
    pub namespace: String,
    /// How many ranks to wait for; `None` reads the StatefulSet's replicas.
    pub replicas: Option<u32>,
    /// `kubectl proxy`'s address, `http://HOST:PORT`.
    pub api_server: String,
    /// How long to wait for the pods in all.
    pub timeout: Duration,
    /// The token file the Secret was made from, for the cluster file.
    pub token_file: PathBuf,
    /// The cluster's DNS domain.
    pub cluster_domain: String,
}

/// A plain-HTTP client of the API server behind `kubectl proxy`.
struct Api {
    base: reqwest::Url,
    http: reqwest::Client,
}

/// An API answer that is not a success.
#[derive(Debug)]
enum ApiError {
    /// Could not talk to the server at all.
    Unreachable(String),
    /// The server answered this status.
    Status(u16, String),
    /// The server answered something unreadable.
    Garbled(String),
}

impl Api {
    fn new(api_server: &str) -> Result<Api, ClusterError> {
        let base = reqwest::Url::parse(api_server).map_err(|e| {
            ClusterError::Invalid(format!(
                "--api-server `{api_server}` is not a URL such as {DEFAULT_API_SERVER}: {e}"
            ))
        })?;
        if base.scheme() != "http" {
            return Err(ClusterError::Invalid(format!(
                "--api-server `{api_server}`: only plain http is spoken; run `kubectl proxy` \
                 (it serves {DEFAULT_API_SERVER}) and point --api-server at it"
            )));
        }
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| ClusterError::Invalid(format!("cannot make an HTTP client: {e}")))?;
        Ok(Api { base, http })
    }

    fn url(&self, path: &str, query: &[(&str, &str)]) -> Result<reqwest::Url, ApiError> {
        let mut url = self
            .base
            .join(path)
            .map_err(|e| ApiError::Garbled(format!("bad API path {path}: {e}")))?;
        if !query.is_empty() {
            url.query_pairs_mut().extend_pairs(query);
        }
        Ok(url)
    }

    async fn send(&self, request: reqwest::RequestBuilder) -> Result<reqwest::Response, ApiError> {
        let response = request.send().await.map_err(|e| {
            ApiError::Unreachable(format!(
                "cannot reach the API server at {}: {}; is `kubectl proxy` running?",
                self.base,
                with_causes(&e)
            ))
        })?;
        if response.status().is_success() {
            return Ok(response);
        }
        let code = response.status().as_u16();
        let body = response.text().await.unwrap_or_default();
        // The API server explains itself in a Status object.
        let message = serde_json::from_str::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v.get("message").and_then(|m| m.as_str()).map(String::from))
            .unwrap_or_else(|| body.trim().to_string());
        Err(ApiError::Status(code, message))
    }

    async fn json<T: serde::de::DeserializeOwned>(
        &self,
        method: reqwest::Method,
        path: &str,
        query: &[(&str, &str)],
    ) -> Result<T, ApiError> {
        let url = self.url(path, query)?;
        let response = self.send(self.http.request(method, url)).await?;
        let bytes = response
            .bytes()
            .await
            .map_err(|e| ApiError::Unreachable(format!("reading an answer from {path}: {e}")))?;
        serde_json::from_slice(&bytes)
            .map_err(|e| ApiError::Garbled(format!("unreadable answer from {path}: {e}")))
    }
}

impl ApiError {
    fn into_cluster(self, doing: &str) -> ClusterError {
        match self {
            ApiError::Unreachable(why) => ClusterError::Scheduler(format!("{doing}: {why}")),
            ApiError::Status(code, message) => ClusterError::Scheduler(format!(
                "{doing}: the API server answered {code}: {message}"
            )),
            ApiError::Garbled(why) => ClusterError::Scheduler(format!("{doing}: {why}")),
        }
    }
}

/// `e: its cause: its cause's cause`, without repeats: reqwest's own
/// message leaves out why (connection refused, ...).
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(next) = cause {
        let said = next.to_string();
        if !text.contains(&said) {
            text = format!("{text}: {said}");
        }
        cause = next.source();
    }
    text
}

fn pods_path(namespace: &str) -> String {
    format!("/api/v1/namespaces/{namespace}/pods")
}

/// Waits until ranks `0..replicas` of the cluster are Ready, calling
/// `progress` with [`PodWatch::progress`] whenever it changes, then writes
/// and returns the cluster file (K8-1, K8-3, K8-5).
pub async fn attach(
    options: &AttachOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<ClusterFile, ClusterError> {
    check_name(&options.name, Flavor::Plain)?;
    check_namespace(&options.namespace)?;
    check_cluster_domain(&options.cluster_domain)?;
    if options.replicas == Some(0) {
        return Err(ClusterError::Invalid(
            "--replicas 0: a cluster needs at least one pod".into(),
        ));
    }
    read_token(&options.token_file).map_err(|e| {
        ClusterError::Invalid(format!(
            "{e}; pass --token-file with the file `k8s manifest` put in the Secret"
        ))
    })?;
    refuse_other_placement(&options.name)?;
    let api = Api::new(&options.api_server)?;
    let replicas = match options.replicas {
        Some(replicas) => replicas,
        None => stateful_set_replicas(&api, options).await?,
    };
    let mut watch = PodWatch::new(
        &options.name,
        &options.namespace,
        replicas,
        &options.cluster_domain,
    );
    let waited = tokio::time::timeout(
        options.timeout,
        watch_until_ready(&api, options, &mut watch, progress),
    )
    .await;
    match waited {
        Ok(result) => result?,
        Err(_) => {
            return Err(ClusterError::Timeout(format!(
                "the pods of `{}` in namespace {} were not all Ready within {:?}: {}; \
                 `kubectl describe pod -n {} -l {}` says why",
                options.name,
                options.namespace,
                options.timeout,
                watch.progress(),
                options.namespace,
                selector(&options.name)
            )));
        }
    }
    let tls = watch.tls()?;
    let file = ClusterFile {
        version: CLUSTER_FILE_VERSION,
        name: options.name.clone(),
        placed: Placed::Kubernetes {
            namespace: options.namespace.clone(),
        },
        spec: BTreeMap::from([
            ("namespace".to_string(), options.namespace.clone()),
            ("replicas".to_string(), replicas.to_string()),
            ("cluster_domain".to_string(), options.cluster_domain.clone()),
            (TLS_SPEC_KEY.to_string(), tls.to_string()),
        ]),
        agents: watch.agents()?,
        token_file: options.token_file.clone(),
        agent_version: env!("CARGO_PKG_VERSION").to_string(),
        created_unix: crate::now_unix(),
    };
    file.save()?;
    Ok(file)
}

/// Whether `file` is of a Kubernetes cluster whose agents use TLS, as
/// [`attach`] recorded it; `None` for other clusters and for files written
/// before it recorded that.
pub fn cluster_uses_tls(file: &ClusterFile) -> Option<bool> {
    match file.placed {
        Placed::Kubernetes { .. } => match file.spec.get(TLS_SPEC_KEY).map(String::as_str) {
            Some("true") => Some(true),
            Some("false") => Some(false),
            _ => None,
        },
        _ => None,
    }
}

/// Refuses a controller whose TLS does not match the agents of a
/// Kubernetes cluster (K8-7), with what to pass instead: otherwise the
/// mismatch shows only as a failed handshake or an unanswered hello.
/// `controller_tls` says whether the controller has a TLS directory
/// (`--tls-dir` or `MONARCH_TLS_DIR`). Other clusters, and files that do
/// not say, pass.
pub fn check_controller_tls(file: &ClusterFile, controller_tls: bool) -> Result<(), ClusterError> {
    match (cluster_uses_tls(file), controller_tls) {
        (Some(true), false) => Err(ClusterError::Invalid(format!(
            "this cluster's agents use TLS: give --tls-dir DIR (or MONARCH_TLS_DIR=DIR), DIR \
             holding {} signed by the same CA as the pods' (the directory of `monarch-host \
             certs new` that cluster `{}`'s TLS Secret was made from)",
            TLS_KEYS.join(", "),
            file.name
        ))),
        (Some(false), true) => Err(ClusterError::Invalid(format!(
            "this cluster's agents run without TLS (--insecure): leave out --tls-dir and unset \
             MONARCH_TLS_DIR, or print cluster `{}`'s manifests again with `k8s manifest \
             --tls-secret NAME`, apply them and attach again",
            file.name
        ))),
        _ => Ok(()),
    }
}

/// A Slurm or SSH cluster of the same name keeps its file: attaching
/// would lose its job.
fn refuse_other_placement(name: &str) -> Result<(), ClusterError> {
    match ClusterFile::load(name) {
        Ok(ClusterFile {
            placed: Placed::Kubernetes { .. },
            ..
        }) => Ok(()),
        Ok(other) => Err(ClusterError::Invalid(format!(
            "a cluster named `{name}` is already up elsewhere ({:?}): bring it down first \
             (e.g. `monarch-host slurm down --name {name}`) or choose another name",
            other.placed
        ))),
        Err(_) => Ok(()),
    }
}

async fn stateful_set_replicas(api: &Api, options: &AttachOptions) -> Result<u32, ClusterError> {
    let path = format!(
        "/apis/apps/v1/namespaces/{}/statefulsets/{}",
        options.namespace, options.name
    );
    let doing = format!("reading StatefulSet {}/{}", options.namespace, options.name);
    let set: StatefulSet = match api.json(reqwest::Method::GET, &path, &[]).await {
        Ok(set) => set,
        Err(ApiError::Status(404, _)) => {
            return Err(ClusterError::Invalid(format!(
                "there is no StatefulSet `{}` in namespace {}: apply the manifests first \
                 (`monarch-host k8s manifest --name {} ... | kubectl apply -f -`), or pass --replicas",
                options.name, options.namespace, options.name
            )));
        }
        Err(e) => return Err(e.into_cluster(&doing)),
    };
    let replicas = set.spec.and_then(|s| s.replicas).unwrap_or(1);
    u32::try_from(replicas)
        .ok()
        .filter(|r| *r > 0)
        .ok_or_else(|| {
            ClusterError::Invalid(format!(
                "StatefulSet {}/{} asks for {replicas} replicas: scale it up first",
                options.namespace, options.name
            ))
        })
}

async fn watch_until_ready(
    api: &Api,
    options: &AttachOptions,
    watch: &mut PodWatch,
    progress: &mut dyn FnMut(&str),
) -> Result<(), ClusterError> {
    let label_selector = selector(&options.name);
    let path = pods_path(&options.namespace);
    let mut shown = String::new();
    let mut show = |watch: &PodWatch| {
        let line = watch.progress();
        if line != shown {
            progress(&line);
            shown = line;
        }
    };
    let mut first = true;
    'list: loop {
        let list: k8s_openapi::List<Pod> = match api
            .json(
                reqwest::Method::GET,
                &path,
                &[("labelSelector", &label_selector)],
            )
            .await
        {
            Ok(list) => list,
            // Most likely `kubectl proxy` is not running: say so at once.
            Err(e) if first => return Err(e.into_cluster("listing the pods")),
            Err(e) => {
                tracing::debug!("listing the pods again failed: {e:?}; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue 'list;
            }
        };
        first = false;
        watch.relist(list);
        show(watch);
        if watch.all_ready() {
            return Ok(());
        }
        loop {
            let version = watch.resource_version().unwrap_or("0").to_string();
            let query = [
                ("labelSelector", label_selector.as_str()),
                ("watch", "true"),
                ("resourceVersion", version.as_str()),
                ("allowWatchBookmarks", "true"),
                ("timeoutSeconds", "300"),
            ];
            let url = api
                .url(&path, &query)
                .map_err(|e| e.into_cluster("watching the pods"))?;
            let mut response = match api.send(api.http.get(url)).await {
                Ok(response) => response,
                Err(ApiError::Status(410, _)) => continue 'list,
                // Not allowed to watch, or no such namespace: waiting will
                // not change that.
                Err(e @ ApiError::Status(401 | 403 | 404, _)) => {
                    return Err(e.into_cluster("watching the pods"));
                }
                Err(e) => {
                    tracing::debug!("watching the pods failed: {e:?}; listing again");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue 'list;
                }
            };
            let mut buffer: Vec<u8> = Vec::new();
            loop {
                let chunk = match response.chunk().await {
                    Ok(Some(chunk)) => chunk,
                    // The server ends watches now and then: resume (K8-5).
                    Ok(None) => break,
                    Err(e) => {
                        tracing::debug!("the pod watch broke: {}; resuming", with_causes(&e));
                        break;
                    }
                };
                buffer.extend_from_slice(&chunk);
                while let Some(end) = buffer.iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = buffer.drain(..=end).collect();
                    if line.iter().all(u8::is_ascii_whitespace) {
                        continue;
                    }
                    let event: WatchEvent<Pod> = serde_json::from_slice(&line).map_err(|e| {
                        ClusterError::Scheduler(format!(
                            "an unreadable pod watch event from the API server: {e}"
                        ))
                    })?;
                    match watch.apply(event) {
                        Next::Continue => {}
                        Next::Relist => continue 'list,
                        Next::Error(why) => {
                            tracing::debug!("the pod watch reported {why}; listing again");
                            tokio::time::sleep(Duration::from_secs(1)).await;
                            continue 'list;
                        }
                    }
                    show(watch);
                    if watch.all_ready() {
                        return Ok(());
                    }
                }
            }
        }
    }
}

/// What `k8s down` deleted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DownReport {
    /// `kind/name` of each object deleted, in the order deleted.
    pub deleted: Vec<String>,
    /// The cluster file removed, if there was one of this cluster.
    pub cluster_file: Option<PathBuf>,
}

/// Deletes cluster `name`'s objects in `namespace` by label (a
/// `MonarchMesh`, where the CRD is installed, then the StatefulSets, the
/// Services and the Secrets), then removes its cluster file and token.
pub async fn down(
    api_server: &str,
    name: &str,
    namespace: &str,
) -> Result<DownReport, ClusterError> {
    check_name(name, Flavor::Plain)?;
    check_namespace(namespace)?;
    let api = Api::new(api_server)?;
    let label_selector = selector(name);
    let by_label = [("labelSelector", label_selector.as_str())];
    let mut report = DownReport::default();

    // The operator would make the StatefulSet again: its MonarchMesh goes
    // first. A 404 means the CRD is not installed.
    let meshes = format!("/apis/monarch.pytorch.org/v1alpha1/namespaces/{namespace}/monarchmeshes");
    let collections = [
        ("monarchmesh", meshes, true),
        (
            "statefulset",
            format!("/apis/apps/v1/namespaces/{namespace}/statefulsets"),
            false,
        ),
    ];
    for (kind, path, optional) in collections {
        let query = [by_label[0], ("propagationPolicy", "Background")];
        match api
            .json::<serde_json::Value>(reqwest::Method::DELETE, &path, &query)
            .await
        {
            Ok(list) => report.deleted.extend(item_names(&list, kind)),
            Err(ApiError::Status(404, _)) if optional => {}
            Err(e) => return Err(e.into_cluster(&format!("deleting the {kind}s of `{name}`"))),
        }
    }

    // Services have no DELETE of a collection before Kubernetes 1.23.
    let services = format!("/api/v1/namespaces/{namespace}/services");
    let list: serde_json::Value = api
        .json(reqwest::Method::GET, &services, &by_label)
        .await
        .map_err(|e| e.into_cluster(&format!("listing the services of `{name}`")))?;
    for service in item_names(&list, "") {
        let path = format!("{services}/{service}");
        match api
            .json::<serde_json::Value>(reqwest::Method::DELETE, &path, &[])
            .await
        {
            Ok(_) => report.deleted.push(format!("service/{service}")),
            Err(ApiError::Status(404, _)) => {}
            Err(e) => return Err(e.into_cluster(&format!("deleting service {service}"))),
        }
    }

    let secrets = format!("/api/v1/namespaces/{namespace}/secrets");
    let list: serde_json::Value = api
        .json(reqwest::Method::DELETE, &secrets, &by_label)
        .await
        .map_err(|e| e.into_cluster(&format!("deleting the secrets of `{name}`")))?;
    report.deleted.extend(item_names(&list, "secret"));

    // Only this cluster's file: one of the same name elsewhere stays.
    let ours = match ClusterFile::load(name) {
        Ok(file) => match file.placed {
            Placed::Kubernetes { namespace: ref ns } if ns == namespace => {
                Some(ClusterFile::path(name)?)
            }
            _ => None,
        },
        Err(ClusterError::Unknown { .. }) => {
            // No cluster file, but `k8s manifest` may have left a token.
            ClusterFile::remove(name)?;
            None
        }
        Err(e) => return Err(e),
    };
    if let Some(path) = ours {
        ClusterFile::remove(name)?;
        report.cluster_file = Some(path);
    }
    Ok(report)
}

/// `kind/name` (or `name` when `kind` is empty) of each item of a list.
fn item_names(list: &serde_json::Value, kind: &str) -> Vec<String> {
    list.get("items")
        .and_then(|items| items.as_array())
        .into_iter()
        .flatten()
        .filter_map(|item| item.pointer("/metadata/name").and_then(|n| n.as_str()))
        .map(|name| match kind {
            "" => name.to_string(),
            kind => format!("{kind}/{name}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> MeshSpec {
        MeshSpec {
            name: "train".into(),
            namespace: "ml".into(),
            replicas: 4,
            image: "registry.example.com/monarch-host:0.1.0".into(),
            gpus: Some(8),
            labels: BTreeMap::from([("kueue.x-k8s.io/queue-name".into(), "team-a".into())]),
            cluster_domain: DEFAULT_CLUSTER_DOMAIN.into(),
            tls_secret: None,
        }
    }

    fn pod(name: &str, uid: &str, version: &str, ready: bool, why: Option<&str>) -> Pod {
        let mut value = serde_json::json!({
            "metadata": {"name": name, "namespace": "ml", "uid": uid, "resourceVersion": version},
            "spec": {"hostname": name, "subdomain": "train", "containers": [{"name": "agent"}]},
            "status": {
                "phase": if ready { "Running" } else { "Pending" },
                "podIP": "10.1.2.3",
                "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
            },
        });
        if let Some(why) = why {
            value["status"]["containerStatuses"] = serde_json::json!([{
                "name": "agent", "image": "x", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"waiting": {"reason": why}},
            }]);
        }
        serde_json::from_value(value).expect("a pod")
    }

    fn list(version: &str, pods: Vec<Pod>) -> k8s_openapi::List<Pod> {
        k8s_openapi::List {
            items: pods,
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta {
                resource_version: Some(version.into()),
                ..Default::default()
            },
        }
    }

    #[test]
    fn k8s_agent_command_has_no_token_and_listens_on_dns_name() {
        let manifests = manifests(&spec(), "s3cret").expect("manifests");
        let (_, agent) = agent_of(&manifests);
        let command = agent.command.clone().expect("a command");
        assert_eq!(
            command,
            [
                "monarch-host",
                "agent",
                "--listen",
                "$(POD_NAME).train.ml.svc.cluster.local:26600",
                "--token-file",
                "/etc/monarch/token",
                "--node",
                "$(POD_NAME)",
                "--idle-exit",
                "0",
                "--insecure"
            ]
        );
        let env = serde_json::to_string(&agent.env).expect("env");
        assert!(!env.contains("s3cret") && !command.join(" ").contains("s3cret"));
        let secret = serde_json::to_value(&manifests.secret).expect("secret");
        // "s3cret" in base64.
        assert_eq!(secret["data"]["token"], "czNjcmV0");
    }

    #[test]
    fn k8s_labels_reach_the_pods_and_the_stateful_set_but_not_the_selector() {
        let manifests = manifests(&spec(), "t").expect("manifests");
        let set = &manifests.stateful_set;
        let labels = set.metadata.labels.clone().expect("labels");
        assert_eq!(labels["kueue.x-k8s.io/queue-name"], "team-a");
        assert_eq!(labels[MESH_LABEL], "train");
        let set_spec = set.spec.as_ref().expect("spec");
        let selector = set_spec.selector.match_labels.clone().expect("selector");
        assert_eq!(selector.len(), 2, "{selector:?}");
        let template = set_spec.template.metadata.as_ref().expect("metadata");
        assert_eq!(
            template.labels.as_ref().expect("labels")["kueue.x-k8s.io/queue-name"],
            "team-a"
        );
        assert_eq!(set_spec.pod_management_policy.as_deref(), Some("Parallel"));
        assert_eq!(set_spec.service_name.as_deref(), Some("train"));
        let service = manifests.service.spec.as_ref().expect("service spec");
        assert_eq!(service.cluster_ip.as_deref(), Some("None"));
        assert_eq!(service.selector.as_ref(), Some(&selector));
    }

    #[test]
    fn k8s_monarch_mesh_listens_under_the_operators_service() {
        let mut spec = spec();
        let built = monarch_mesh(&spec, "t").expect("a MonarchMesh");
        let value = serde_json::to_value(&built.mesh).expect("json");
        assert_eq!(value["apiVersion"], "monarch.pytorch.org/v1alpha1");
        assert_eq!(value["spec"]["replicas"], 4);
        assert_eq!(value["spec"]["port"], 26600);
        let command = &value["spec"]["podTemplate"]["spec"]["containers"][0]["command"];
        assert_eq!(
            command[3],
            "$(POD_NAME).train-svc.ml.svc.cluster.local:26600"
        );
        spec.name = "my-train".into();
        assert!(
            monarch_mesh(&spec, "t").is_err(),
            "the operator refuses `-` in names"
        );
    }

    #[test]
    fn k8s_bad_input_is_refused_with_a_reason() {
        let mut bad = spec();
        bad.replicas = 0;
        assert!(
            manifests(&bad, "t")
                .unwrap_err()
                .to_string()
                .contains("--replicas 0")
        );
        for name in ["Train", "train_1", "-x", "x-", &"a".repeat(53)] {
            let mut bad = spec();
            bad.name = name.to_string();
            assert!(manifests(&bad, "t").is_err(), "{name}");
        }
        assert!(parse_label("novalue").is_err());
        assert!(parse_label("a/b/c=d").is_err());
        assert!(parse_label("key=bad value").is_err());
        assert!(parse_label(&format!("{MESH_LABEL}=other")).is_err());
        assert_eq!(
            parse_label("kueue.x-k8s.io/queue-name=team-a").expect("a label"),
            (
                "kueue.x-k8s.io/queue-name".to_string(),
                "team-a".to_string()
            )
        );
        assert_eq!(parse_label("empty=").expect("a label").1, "");
    }

    #[test]
    fn k8s_manifests_are_deterministic() {
        let a = manifests(&spec(), "t")
            .and_then(|m| m.render())
            .expect("yaml");
        let b = manifests(&spec(), "t")
            .and_then(|m| m.render())
            .expect("yaml");
        assert_eq!(a, b);
        assert_eq!(a.matches("---\n").count(), 2);
    }

    #[test]
    fn k8s_progress_names_the_pods_not_ready() {
        let mut watch = PodWatch::new("train", "ml", 3, "cluster.local");
        watch.relist(list(
            "10",
            vec![
                pod("train-0", "a", "5", true, None),
                pod("train-1", "b", "6", false, Some("ContainerCreating")),
            ],
        ));
        assert_eq!(
            watch.progress(),
            "1/3 pods ready (train-1 Pending: ContainerCreating, train-2 missing)"
        );
        assert_eq!(watch.resource_version(), Some("10"));
        assert!(!watch.all_ready());
    }

    #[test]
    fn k8s_restarted_pod_counts_only_once_ready_again() {
        let mut watch = PodWatch::new("train", "ml", 2, "cluster.local");
        watch.relist(list(
            "10",
            vec![
                pod("train-0", "a", "5", true, None),
                pod("train-1", "b", "6", true, None),
            ],
        ));
        assert!(watch.all_ready());
        // train-0 restarts: unready, deleted, then a new pod of that name.
        watch.apply(WatchEvent::Modified(pod("train-0", "a", "11", false, None)));
        assert!(!watch.all_ready());
        watch.apply(WatchEvent::Added(pod(
            "train-0",
            "c",
            "12",
            false,
            Some("ContainerCreating"),
        )));
        // The old pod's deletion, seen late, does not remove the new one.
        watch.apply(WatchEvent::Deleted(pod("train-0", "a", "13", false, None)));
        assert_eq!(
            watch.progress(),
            "1/2 pods ready (train-0 Pending: ContainerCreating)"
        );
        watch.apply(WatchEvent::Modified(pod("train-0", "c", "14", true, None)));
        assert!(watch.all_ready());
        assert_eq!(watch.resource_version(), Some("14"));
        let agents = watch.agents().expect("agents");
        assert_eq!(agents[0].addr, "train-0.train.ml.svc.cluster.local:26600");
        assert_eq!(agents[0].node, "train-0");
    }

    #[test]
    fn k8s_gone_asks_for_a_relist_and_bookmarks_move_the_version() {
        let mut watch = PodWatch::new("train", "ml", 1, "cluster.local");
        let bookmark: WatchEvent<Pod> = serde_json::from_str(
            r#"{"type":"BOOKMARK","object":{"kind":"Pod","apiVersion":"v1","metadata":{"resourceVersion":"42"}}}"#,
        )
        .expect("a bookmark");
        assert_eq!(watch.apply(bookmark), Next::Continue);
        assert_eq!(watch.resource_version(), Some("42"));
        let gone: WatchEvent<Pod> = serde_json::from_str(
            r#"{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"too old resource version: 1 (42)","reason":"Expired","code":410}}"#,
        )
        .expect("an error event");
        assert_eq!(watch.apply(gone), Next::Relist);
    }

    #[test]
    fn k8s_terminating_pod_is_not_ready() {
        let mut watch = PodWatch::new("train", "ml", 1, "cluster.local");
        let mut leaving = pod("train-0", "a", "5", true, None);
        leaving.metadata.deletion_timestamp = Some(
            serde_json::from_value(serde_json::json!("2025-01-01T00:00:00Z")).expect("a time"),
        );
        watch.apply(WatchEvent::Modified(leaving));
        assert!(!watch.all_ready());
        assert!(
            watch.progress().contains("train-0 Terminating"),
            "{}",
            watch.progress()
        );
    }

    fn agent_of(manifests: &Manifests) -> (PodSpec, Container) {
        let pod = manifests
            .stateful_set
            .spec
            .as_ref()
            .and_then(|s| s.template.spec.clone())
            .expect("a pod spec");
        let agent = pod.containers[0].clone();
        (pod, agent)
    }

    #[test]
    fn k8s_6_tls_secret_is_mounted_read_only_and_replaces_insecure() {
        let mut spec = spec();
        spec.tls_secret = Some("train-tls".into());
        let (pod, agent) = agent_of(&manifests(&spec, "t").expect("manifests"));
        let command = agent.command.expect("a command");
        assert_eq!(
            command[command.len() - 2..],
            ["--tls-dir", "/etc/monarch-tls"]
        );
        assert!(!command.iter().any(|a| a == "--insecure"), "{command:?}");
        let mount = agent
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| m.mount_path == TLS_DIR)
            .expect("the TLS mount");
        assert_eq!(mount.read_only, Some(true));
        let volume = pod
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == mount.name)
            .and_then(|v| v.secret.clone())
            .expect("the TLS volume");
        assert_eq!(volume.secret_name.as_deref(), Some("train-tls"));
        assert_eq!(volume.default_mode, Some(0o400));
        let keys: Vec<String> = volume
            .items
            .iter()
            .flatten()
            .map(|i| i.key.clone())
            .collect();
        // Only the three files: never the CA's key, even if the Secret has it.
        assert_eq!(keys, ["ca.pem", "host.pem", "host.key"]);

        // The operator's pods get the same.
        let mesh = monarch_mesh(
            &{
                let mut spec = spec.clone();
                spec.name = "train1".into();
                spec
            },
            "t",
        )
        .expect("a MonarchMesh");
        let value = serde_json::to_value(&mesh.mesh).expect("json");
        let command = &value["spec"]["podTemplate"]["spec"]["containers"][0]["command"];
        assert!(
            command
                .to_string()
                .contains("\"--tls-dir\",\"/etc/monarch-tls\""),
            "{command}"
        );

        // Without a TLS Secret: --insecure and no TLS volume.
        let (pod, agent) = agent_of(&manifests(&self::spec(), "t").expect("manifests"));
        assert_eq!(
            agent.command.expect("a command").last().map(String::as_str),
            Some("--insecure")
        );
        assert_eq!(pod.volumes.expect("volumes").len(), 1);
    }

    #[test]
    fn k8s_6_tls_secret_name_must_be_a_dns_subdomain() {
        for good in ["train-tls", "tls", "a.b-c.d", "0tls"] {
            check_secret_name(good).unwrap_or_else(|e| panic!("{good}: {e}"));
        }
        for bad in [
            "",
            "Train-TLS",
            "-tls",
            "tls-",
            "a..b",
            ".tls",
            "tls.",
            "tls_1",
            "t ls",
            &"a".repeat(254),
        ] {
            let error = check_secret_name(bad).expect_err(bad).to_string();
            assert!(
                error.contains("is not a Kubernetes Secret name"),
                "{bad}: {error}"
            );
        }
        let mut spec = spec();
        spec.tls_secret = Some("train-token".into());
        let error = manifests(&spec, "t")
            .expect_err("the token Secret's name")
            .to_string();
        assert!(error.contains("token Secret"), "{error}");
        spec.tls_secret = Some("Bad".into());
        assert!(manifests(&spec, "t").is_err());
    }

    fn pod_with_command(name: &str, command: &[&str]) -> Pod {
        let mut pod = pod(name, name, "5", true, None);
        if let Some(spec) = pod.spec.as_mut() {
            spec.containers[0].command = Some(command.iter().map(|s| s.to_string()).collect());
        }
        pod
    }

    #[test]
    fn k8s_7_tls_is_read_from_the_ready_pods() {
        let tls = ["monarch-host", "agent", "--tls-dir", "/etc/monarch-tls"];
        let plain = ["monarch-host", "agent", "--insecure"];
        let mut watch = PodWatch::new("train", "ml", 2, "cluster.local");
        watch.relist(list(
            "10",
            vec![
                pod_with_command("train-0", &tls),
                pod_with_command("train-1", &tls),
            ],
        ));
        assert!(watch.tls().expect("agreed"));
        watch.relist(list(
            "11",
            vec![
                pod_with_command("train-0", &plain),
                pod_with_command("train-1", &plain),
            ],
        ));
        assert!(!watch.tls().expect("agreed"));
        watch.relist(list(
            "12",
            vec![
                pod_with_command("train-0", &tls),
                pod_with_command("train-1", &plain),
            ],
        ));
        let error = watch.tls().expect_err("a half-done rollout").to_string();
        assert!(
            error.contains("disagree on TLS") && error.contains("train-1"),
            "{error}"
        );
        // The environment variable counts too.
        let mut by_env = pod_with_command("train-0", &plain);
        if let Some(spec) = by_env.spec.as_mut() {
            spec.containers[0].env = Some(vec![EnvVar {
                name: "MONARCH_TLS_DIR".into(),
                value: Some("/tls".into()),
                ..EnvVar::default()
            }]);
        }
        assert!(agent_uses_tls(&by_env));
    }

    #[test]
    fn k8s_7_a_controller_must_match_the_agents_tls() {
        let file = |placed: Placed, tls: Option<&str>| ClusterFile {
            version: CLUSTER_FILE_VERSION,
            name: "train".into(),
            placed,
            spec: tls
                .map(|tls| BTreeMap::from([(TLS_SPEC_KEY.to_string(), tls.to_string())]))
                .unwrap_or_default(),
            agents: vec![],
            token_file: PathBuf::from("/t"),
            agent_version: "0".into(),
            created_unix: 0,
        };
        let k8s = || Placed::Kubernetes {
            namespace: "ml".into(),
        };
        let error = check_controller_tls(&file(k8s(), Some("true")), false)
            .expect_err("no --tls-dir")
            .to_string();
        assert!(
            error.starts_with("this cluster's agents use TLS: give --tls-dir"),
            "{error}"
        );
        let error = check_controller_tls(&file(k8s(), Some("false")), true)
            .expect_err("a --tls-dir the agents do not speak")
            .to_string();
        assert!(error.contains("without TLS (--insecure)"), "{error}");
        check_controller_tls(&file(k8s(), Some("true")), true).expect("both TLS");
        check_controller_tls(&file(k8s(), Some("false")), false).expect("both plain");
        // Files written before TLS was recorded, and other placements, pass.
        check_controller_tls(&file(k8s(), None), false).expect("unknown");
        check_controller_tls(&file(Placed::Ssh, Some("true")), false).expect("not Kubernetes");
    }
}
