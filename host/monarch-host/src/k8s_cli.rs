//! `monarch-host k8s`: agents as the pods of a StatefulSet. `manifest`
//! prints the objects for `kubectl apply -f -`, `attach` waits for the pods
//! and writes the cluster file that `run --cluster NAME` reads, `down`
//! deletes them. The logic is `monarch_cluster::k8s`; this is its face.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use monarch_cluster::k8s::{self, Flavor, MeshSpec};

/// `monarch-host k8s`.
#[derive(Debug, clap::Args)]
pub struct K8sArgs {
    #[command(subcommand)]
    command: K8sCommand,
}

#[derive(Debug, clap::Subcommand)]
enum K8sCommand {
    /// Prints the Kubernetes objects of a cluster of agents, as YAML
    /// documents for `kubectl apply -f -`: the token as a Secret, a
    /// headless Service, and a StatefulSet whose pods NAME-0, NAME-1...
    /// each run `monarch-host agent` on port 26600. The token is made once
    /// and kept in the clusters directory (or read from --token-file); it
    /// is never on a command line.
    ///
    /// Example: monarch-host k8s manifest --name train --replicas 4 --image registry.example.com/monarch-host:0.1.0 --gpus 8 | kubectl apply -f -
    Manifest(ManifestArgs),
    /// Waits until the cluster's pods NAME-0..NAME-{K-1} are all Ready
    /// (their agents listen), then writes the cluster file that `run
    /// --cluster NAME` reads, with the pods' DNS names. Talks plain HTTP
    /// to the API server through `kubectl proxy`: run it first.
    ///
    /// Example: kubectl proxy & monarch-host k8s attach --name train
    Attach(AttachArgs),
    /// Deletes the cluster's objects by label (its MonarchMesh, if any,
    /// StatefulSet, Service and Secret) through `kubectl proxy`, and
    /// removes its cluster file and token.
    ///
    /// Example: monarch-host k8s down --name train
    Down(DownArgs),
}

#[derive(Debug, clap::Args)]
struct ManifestArgs {
    /// The cluster's name: names the StatefulSet, the Service, the pods
    /// (NAME-0, NAME-1...) and, for `run --cluster`, the cluster.
    #[arg(long)]
    name: String,
    /// How many pods (agents).
    #[arg(long)]
    replicas: u32,
    /// The container image: one with `monarch-host` on its PATH, such as
    /// the one the repository's Containerfile builds.
    #[arg(long)]
    image: String,
    /// The namespace of every object.
    #[arg(long, default_value = k8s::DEFAULT_NAMESPACE)]
    namespace: String,
    /// GPUs per pod: an `nvidia.com/gpu` limit.
    #[arg(long)]
    gpus: Option<u32>,
    /// A label KEY=VALUE for the StatefulSet and its pods, e.g.
    /// `kueue.x-k8s.io/queue-name=team-a` for Kueue's gang scheduling.
    /// May be given more than once.
    #[arg(long = "label", value_name = "KEY=VALUE")]
    labels: Vec<String>,
    /// Puts the token in this file into the Secret, instead of the one
    /// kept in the clusters directory (pass it to `k8s attach` too).
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// Prints a `MonarchMesh` (monarch.pytorch.org/v1alpha1) for Monarch's
    /// operator instead of the Service and the StatefulSet; the operator
    /// makes those (its Service is NAME-svc). The Secret is printed too.
    #[arg(long)]
    monarchmesh: bool,
    /// The cluster's DNS domain.
    #[arg(long, default_value = k8s::DEFAULT_CLUSTER_DOMAIN)]
    cluster_domain: String,
    /// Runs the agents with mutual TLS: NAME is a Secret in the namespace
    /// holding ca.pem, host.pem and host.key from `monarch-host certs new
    /// --dir D`, made with `kubectl create secret generic NAME
    /// --from-file=ca.pem=D/ca.pem --from-file=host.pem=D/host.pem
    /// --from-file=host.key=D/host.key` (never ca.key). The pods mount it
    /// read-only at /etc/monarch-tls and their agents get `--tls-dir
    /// /etc/monarch-tls`; one host certificate serves every pod. Without
    /// it the agents run with `--insecure`: traffic and the token travel in
    /// clear on the cluster network.
    #[arg(long, value_name = "NAME", value_parser = parse_tls_secret)]
    tls_secret: Option<String>,
}

fn parse_tls_secret(text: &str) -> Result<String, String> {
    k8s::check_secret_name(text)
        .map(|()| text.to_string())
        .map_err(|e| e.to_string())
}

#[derive(Debug, clap::Args)]
struct AttachArgs {
    /// The cluster's name, as given to `k8s manifest`.
    #[arg(long)]
    name: String,
    /// Its namespace.
    #[arg(long, default_value = k8s::DEFAULT_NAMESPACE)]
    namespace: String,
    /// How many pods to wait for. Default: the StatefulSet's replicas.
    #[arg(long)]
    replicas: Option<u32>,
    /// Where `kubectl proxy` serves the API (plain http).
    #[arg(long, default_value = k8s::DEFAULT_API_SERVER)]
    api_server: String,
    /// Seconds to wait for the pods to be Ready.
    #[arg(long, default_value_t = 600.0)]
    timeout: f64,
    /// The token file the Secret was made from. Default: the one `k8s
    /// manifest` keeps in the clusters directory.
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// The cluster's DNS domain.
    #[arg(long, default_value = k8s::DEFAULT_CLUSTER_DOMAIN)]
    cluster_domain: String,
}

#[derive(Debug, clap::Args)]
struct DownArgs {
    /// The cluster's name.
    #[arg(long)]
    name: String,
    /// Its namespace. Default: the one in its cluster file, else `default`.
    #[arg(long)]
    namespace: Option<String>,
    /// Where `kubectl proxy` serves the API (plain http).
    #[arg(long, default_value = k8s::DEFAULT_API_SERVER)]
    api_server: String,
}

/// Runs `monarch-host k8s`.
pub fn command(args: K8sArgs) -> ExitCode {
    let result = match args.command {
        K8sCommand::Manifest(args) => manifest(args),
        K8sCommand::Attach(args) => attach(args),
        K8sCommand::Down(args) => down(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("monarch-host k8s: error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn manifest(args: ManifestArgs) -> anyhow::Result<()> {
    let flavor = match args.monarchmesh {
        true => Flavor::MonarchMesh,
        false => Flavor::Plain,
    };
    let mut labels = BTreeMap::new();
    for label in &args.labels {
        let (key, value) = k8s::parse_label(label)?;
        labels.insert(key, value);
    }
    let spec = MeshSpec {
        name: args.name,
        namespace: args.namespace,
        replicas: args.replicas,
        image: args.image,
        gpus: args.gpus,
        labels,
        cluster_domain: args.cluster_domain,
        tls_secret: args.tls_secret,
    };
    // Refuse bad flags before a token file is made for them.
    spec.check(flavor)?;
    let token = k8s::manifest_token(&spec.name, args.token_file.as_deref())?;
    let yaml = match flavor {
        Flavor::Plain => k8s::manifests(&spec, &token.secret)?.render()?,
        Flavor::MonarchMesh => k8s::monarch_mesh(&spec, &token.secret)?.render()?,
    };
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(yaml.as_bytes())
        .and_then(|()| stdout.flush())
        .map_err(|e| anyhow::anyhow!("writing the manifests: {e}"))?;
    match (&args.token_file, token.made) {
        (Some(file), _) => eprintln!(
            "k8s manifest: the Secret holds the cluster token in {}; pass `--token-file {}` to \
             `k8s attach` too",
            file.display(),
            file.display()
        ),
        (None, made) => eprintln!(
            "k8s manifest: the Secret holds the cluster token kept in {} ({}); `k8s attach` \
             reads it there and `k8s down` removes it",
            token.file.display(),
            match made {
                true => "made now",
                false => "made by an earlier `k8s manifest`",
            }
        ),
    }
    match &spec.tls_secret {
        Some(tls) => eprintln!(
            "k8s manifest: the agents use TLS with Secret {tls}, mounted at {dir}; make it in \
             namespace {ns} with `kubectl create secret generic {tls} -n {ns} \
             --from-file=ca.pem=D/ca.pem --from-file=host.pem=D/host.pem \
             --from-file=host.key=D/host.key` (D from `monarch-host certs new --dir D`), and \
             give `run --cluster {name}` --tls-dir D",
            dir = k8s::TLS_DIR,
            ns = spec.namespace,
            name = spec.name,
        ),
        None => eprintln!(
            "k8s manifest: WARNING: the agents run with --insecure: traffic and the cluster \
             token travel in clear on the cluster network; pass --tls-secret NAME to use TLS"
        ),
    }
    Ok(())
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| anyhow::anyhow!("cannot start the async runtime: {e}"))
}

fn attach(args: AttachArgs) -> anyhow::Result<()> {
    if !(args.timeout.is_finite() && args.timeout > 0.0) {
        anyhow::bail!("--timeout must be a positive number of seconds");
    }
    let token_file = match args.token_file {
        Some(file) => file,
        None => k8s::default_token_file(&args.name)?,
    };
    let options = k8s::AttachOptions {
        name: args.name,
        namespace: args.namespace,
        replicas: args.replicas,
        api_server: args.api_server,
        timeout: Duration::from_secs_f64(args.timeout),
        token_file,
        cluster_domain: args.cluster_domain,
    };
    let mut progress = |line: &str| eprintln!("k8s attach: {line}");
    let file = runtime()?.block_on(k8s::attach(&options, &mut progress))?;
    let path = monarch_cluster::ClusterFile::path(&file.name)?;
    eprintln!(
        "k8s attach: {} agents ready; wrote {}",
        file.agents.len(),
        path.display()
    );
    let tls = match k8s::cluster_uses_tls(&file) {
        Some(true) => {
            eprintln!(
                "k8s attach: the agents use TLS: give `run --cluster` the TLS directory their \
                 Secret was made from"
            );
            " --tls-dir DIR"
        }
        _ => "",
    };
    println!(
        "monarch-host run --cluster {}{tls} PROGRAM.wasm   # from a machine that resolves the pods' DNS names",
        file.name
    );
    Ok(())
}

fn down(args: DownArgs) -> anyhow::Result<()> {
    let namespace = match args.namespace {
        Some(namespace) => namespace,
        None => match monarch_cluster::ClusterFile::load(&args.name) {
            Ok(monarch_cluster::ClusterFile {
                placed: monarch_cluster::Placed::Kubernetes { namespace },
                ..
            }) => namespace,
            _ => k8s::DEFAULT_NAMESPACE.to_string(),
        },
    };
    let report = runtime()?.block_on(k8s::down(&args.api_server, &args.name, &namespace))?;
    if report.deleted.is_empty() {
        println!(
            "k8s down: nothing labelled {} in namespace {namespace}",
            k8s::selector(&args.name)
        );
    }
    for object in &report.deleted {
        println!("k8s down: deleted {object} in namespace {namespace}");
    }
    if let Some(path) = &report.cluster_file {
        println!("k8s down: removed the cluster file {}", path.display());
    }
    Ok(())
}
