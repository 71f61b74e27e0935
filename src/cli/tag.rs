//! `sidecar-injector tag`: revision tags, through the caller's kubeconfig. `set` makes a tag's webhook
//! configurations from its revision's (or moves it to another revision), `list` shows the tags with the namespaces
//! labelled with each, `remove` deletes one no namespace uses. What a tag is: [`crate::status::tags`].

use std::path::PathBuf;

use clap::{Args, Subcommand, ValueEnum};
use serde_json::{Value, json};

use super::CliError;
use crate::status::tags::{self, CONFIGURATION, RESOURCES};
use crate::status::{self, Cluster, ClusterError};
use sidecar_injector_core::Tag;
use sidecar_injector_core::settings::Keys;

/// What `tag` says on `--help` after the flags.
pub const TAG_HELP: &str = "\
A revision tag is a stable name (prod, canary) that points to a revision: namespaces are labelled \
<prefix>rev=TAG instead of with a revision's name, and move when the tag moves. A tag is a \
MutatingWebhookConfiguration and a ValidatingWebhookConfiguration named sidecar-injector-tag-TAG: the revision's \
webhooks (from the configurations named sidecar-injector), each calling the revision's path with /tag/TAG, for the \
namespaces labelled with the tag. Pods injected through a tag carry it in their status annotation. Moving a tag \
changes what new pods get; `sidecar-injector status` then lists the running ones as other-revision and --restart \
rolls them.

Exit codes: 0 done; 1 refused (no such revision or tag, a tag with a revision's name, a tag that points elsewhere \
without --overwrite, a tag still labelled on namespaces without --force); 2 bad usage, no usable kubeconfig, an API \
server that cannot be reached or refuses.";

/// Arguments of `tag`.
#[derive(Debug, Args)]
#[command(after_help = TAG_HELP)]
pub struct TagArgs {
    /// What to do with tags.
    #[command(subcommand)]
    pub action: TagAction,

    /// The kubeconfig file [default: KUBECONFIG, then ~/.kube/config, then the pod's service account].
    #[arg(long, value_name = "FILE", global = true)]
    pub kubeconfig: Option<PathBuf>,

    /// The kubeconfig context to use [default: its current context].
    #[arg(long, value_name = "NAME", global = true)]
    pub context: Option<String>,

    /// The prefix of the injector's labels and annotations (`<prefix>rev`), as `serve` was given it.
    #[arg(long, value_name = "PREFIX", default_value = sidecar_injector_core::settings::DEFAULT_PREFIX,
          env = "SIDECAR_INJECTOR_ANNOTATION_PREFIX", global = true)]
    pub annotation_prefix: String,
}

/// The `tag` subcommands.
#[derive(Debug, Subcommand)]
pub enum TagAction {
    /// Point TAG at a revision: make its webhook configurations, or move them.
    Set {
        /// The tag (a DNS label).
        #[arg(value_parser = parse_tag)]
        tag: Tag,
        /// The revision it points to (`default`: the webhooks at the bare paths).
        #[arg(long, value_name = "REVISION")]
        revision: String,
        /// Move a tag that points to another revision.
        #[arg(long)]
        overwrite: bool,
        /// Print the webhook configurations as YAML (for GitOps), and change nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// The tags, each with its revision and the namespaces labelled with it.
    List {
        /// Output format.
        #[arg(short = 'o', long, value_enum, default_value_t = ListOutput::Table)]
        output: ListOutput,
    },
    /// Delete TAG's webhook configurations.
    Remove {
        /// The tag.
        #[arg(value_parser = parse_tag)]
        tag: Tag,
        /// Even if namespaces are still labelled with it (their new pods are then injected by nothing).
        #[arg(long)]
        force: bool,
    },
}

/// `table` or `json`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ListOutput {
    /// One line per tag.
    Table,
    /// A JSON array.
    Json,
}

fn parse_tag(text: &str) -> Result<Tag, String> {
    Tag::new(text)
}

/// Runs `tag`.
pub fn run(args: &TagArgs) -> Result<(), CliError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::Config(format!("cannot start the runtime for the API calls: {e}")))?;
    runtime.block_on(async {
        let cluster = Cluster::connect(args.kubeconfig.as_deref(), args.context.as_deref()).await.map_err(config)?;
        let keys = Keys::new(&args.annotation_prefix);
        match &args.action {
            TagAction::Set { tag, revision, overwrite, dry_run } => {
                set(&cluster, &keys, tag, revision, *overwrite, *dry_run).await
            }
            TagAction::List { output } => list(&cluster, &keys, *output).await,
            TagAction::Remove { tag, force } => remove(&cluster, &keys, tag, *force).await,
        }
    })
}

async fn set(
    cluster: &Cluster,
    keys: &Keys,
    tag: &Tag,
    revision: &str,
    overwrite: bool,
    dry_run: bool,
) -> Result<(), CliError> {
    let name = tags::configuration_name(tag);
    let mut derived = Vec::new();
    for kind in RESOURCES {
        let Some(configuration) = cluster.webhook_configuration(kind, CONFIGURATION).await.map_err(config)? else {
            return Err(CliError::Refused(format!("no {kind}/{CONFIGURATION}: is the injector installed?")));
        };
        derived.push(tags::derive(tag, revision, &configuration, keys).map_err(|e| CliError::Refused(e.to_string()))?);
    }
    let existing = cluster.webhook_configuration(RESOURCES[0], &name).await.map_err(config)?;
    let pointed = existing.as_ref().map(|e| tags::pointed(std::slice::from_ref(e)));
    let before = pointed.as_ref().and_then(|p| p.get(tag.as_str())).cloned();
    if let Some(before) = before.as_ref().filter(|before| *before != revision)
        && !overwrite
    {
        return Err(CliError::Refused(format!("tag {tag} points to revision {before}: --overwrite moves it")));
    }
    if dry_run {
        let documents: Vec<String> = derived.iter().map(super::policy::to_yaml).collect::<Result<_, _>>()?;
        return super::stdout(documents.join("---\n"));
    }
    // The validating configuration first: while the two differ, the old revision's validation of a pod the new
    // one injected admits it (another version's stamp), and the new one's validation of the old one's likewise.
    for (kind, object) in RESOURCES.iter().rev().zip(derived.iter().rev()) {
        cluster.apply_webhook_configuration(kind, object).await.map_err(config)?;
    }
    let namespaces = cluster.namespaces_labelled(&keys.rev, tag.as_str()).await.map_err(config)?;
    let moved = match before {
        Some(before) if before != revision => format!("moved from revision {before} to {revision}"),
        Some(_) => format!("points to revision {revision} (updated from its webhooks)"),
        None => format!("points to revision {revision}"),
    };
    super::stdout(format!(
        "tag {tag} {moved}: {} namespace(s) labelled {}={tag}{}\n",
        namespaces.len(),
        keys.rev,
        if namespaces.is_empty() { String::new() } else { format!(" ({})", namespaces.join(", ")) }
    ))?;
    if !namespaces.is_empty() {
        super::stderr(format_args!(
            "sidecar-injector: new pods get revision {revision}; `sidecar-injector status -n {}` shows the running \
             ones, --restart rolls them\n",
            namespaces.join(",")
        ));
    }
    Ok(())
}

async fn list(cluster: &Cluster, keys: &Keys, output: ListOutput) -> Result<(), CliError> {
    let mut rows = Vec::new();
    for (tag, revision) in cluster.revision_tags().await.map_err(config)? {
        let namespaces = cluster.namespaces_labelled(&keys.rev, &tag).await.map_err(config)?;
        rows.push(json!({"tag": tag, "revision": revision, "namespaces": namespaces}));
    }
    let text = match output {
        ListOutput::Json => serde_json::to_string_pretty(&rows).expect("JSON serialises") + "\n",
        ListOutput::Table => {
            let mut table = vec![["TAG".to_owned(), "REVISION".to_owned(), "NAMESPACES".to_owned()]];
            for row in &rows {
                let namespaces: Vec<&str> =
                    row["namespaces"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
                let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
                table.push([text(&row["tag"]), text(&row["revision"]), namespaces.join(",")]);
            }
            let width = |column: usize| table.iter().map(|row| row[column].len()).max().unwrap_or(0);
            let (tag_width, revision_width) = (width(0), width(1));
            table
                .iter()
                .map(|[tag, revision, namespaces]| {
                    format!("{tag:tag_width$}  {revision:revision_width$}  {namespaces}").trim_end().to_owned() + "\n"
                })
                .collect()
        }
    };
    super::stdout(text)
}

async fn remove(cluster: &Cluster, keys: &Keys, tag: &Tag, force: bool) -> Result<(), CliError> {
    let name = tags::configuration_name(tag);
    let namespaces = cluster.namespaces_labelled(&keys.rev, tag.as_str()).await.map_err(config)?;
    if !namespaces.is_empty() && !force {
        return Err(CliError::Refused(format!(
            "namespaces {} are labelled {}={tag}: relabel them first, or --force",
            namespaces.join(", "),
            keys.rev
        )));
    }
    let mut removed = false;
    for kind in RESOURCES {
        removed |= cluster.delete_webhook_configuration(kind, &name).await.map_err(config)?;
    }
    if !removed {
        return Err(CliError::Refused(format!("no tag {tag} (no webhook configuration {name})")));
    }
    super::stdout(format!("tag {tag} removed\n"))
}

fn config(error: ClusterError) -> CliError {
    CliError::Config(status::chain(&error))
}
