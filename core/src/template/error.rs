//! What goes wrong when a template is read, compiled or proven: every problem at its file and line.

use super::yaml::{PathSeg, display_path};

/// A problem at a node of a template: where it is (the path from the file's root, or from a section) and the rule
/// it breaks, as a sentence. Made into a [`TemplateError`] at the node's line once the file is known.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Problem {
    pub path: Vec<PathSeg>,
    pub rule: String,
}

impl Problem {
    pub(crate) fn new(path: Vec<PathSeg>, rule: impl Into<String>) -> Self {
        Problem { path, rule: rule.into() }
    }

    /// The same problem, its path taken from under the section `key`.
    pub(crate) fn under(self, key: &str) -> Self {
        Problem { path: [vec![PathSeg::Key(key.to_owned())], self.path].concat(), rule: self.rule }
    }
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", display_path(&self.path), self.rule)
    }
}

/// Why a template (or a set of them) was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TemplateError {
    /// The file could not be read.
    #[error("{file}: cannot read template: {source}")]
    Read {
        /// The file.
        file: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The template is malformed or invalid at a given line.
    #[error("{file}:{line}: {reason}")]
    Invalid {
        /// The file (or a label for an in-memory source).
        file: String,
        /// 1-based line.
        line: usize,
        /// What is wrong and, where useful, what was expected.
        reason: String,
    },
    /// The template directory as a whole is unusable (unreadable, empty, no default template).
    #[error("{dir}: {reason}")]
    Directory {
        /// The directory.
        dir: String,
        /// What is wrong.
        reason: String,
    },
    /// Several files were refused; each error is on its own line.
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
    Several(Vec<TemplateError>),
}

impl TemplateError {
    /// What was refused, quoting nothing of it (a reason can quote the template): the files' names, or the template
    /// directory. For what any client may read, as `/readyz`; the reason itself goes to the log.
    pub fn subject(&self) -> String {
        let name = |file: &str| {
            std::path::Path::new(file).file_name().map_or_else(|| file.to_owned(), |n| n.to_string_lossy().into_owned())
        };
        match self {
            TemplateError::Read { file, .. } | TemplateError::Invalid { file, .. } => name(file),
            TemplateError::Directory { .. } => "the template directory".to_owned(),
            TemplateError::Several(errors) => {
                let mut names: Vec<String> = errors.iter().map(TemplateError::subject).collect();
                names.dedup();
                names.join(", ")
            }
        }
    }
}

/// One error for several: the only one, or all of them.
pub(crate) fn several(mut errors: Vec<TemplateError>) -> TemplateError {
    if errors.len() == 1 { errors.remove(0) } else { TemplateError::Several(errors) }
}

/// The problems of one file in the order of their lines, as one error.
pub(crate) fn by_line(mut errors: Vec<TemplateError>) -> TemplateError {
    errors.sort_by_key(|e| match e {
        TemplateError::Invalid { line, .. } => *line,
        _ => 0,
    });
    several(errors)
}
