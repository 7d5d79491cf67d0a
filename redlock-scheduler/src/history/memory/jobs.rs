//! The published job definitions in memory, each statement a method that does what
//! [`Definitions`](super::super::Definitions)' SQL does.

use std::collections::BTreeMap;

use super::super::{JobDefinition, from_ms, ms};

/// The job definitions table: (scheduler, job) to the definition last published.
#[derive(Debug, Default)]
pub(in super::super) struct PublishedJobs {
    rows: BTreeMap<(String, String), JobDefinition>,
}

impl PublishedJobs {
    /// [`Definitions::publish_jobs`](super::super::Definitions::publish_jobs): each
    /// replaces the one of its name, as `instance` published it.
    pub(in super::super) fn publish(
        &mut self,
        scheduler: &str,
        instance: &str,
        definitions: &[JobDefinition],
    ) {
        for definition in definitions {
            let row = JobDefinition {
                updated: from_ms(ms(definition.updated)),
                updated_by: instance.to_owned(),
                ..definition.clone()
            };
            self.rows
                .insert((scheduler.to_owned(), definition.job.clone()), row);
        }
    }

    /// [`Definitions::unpublish_job`](super::super::Definitions::unpublish_job).
    pub(in super::super) fn unpublish(&mut self, scheduler: &str, job: &str) {
        self.rows.remove(&(scheduler.to_owned(), job.to_owned()));
    }

    /// [`Definitions::job_definitions`](super::super::Definitions::job_definitions), by
    /// name.
    pub(in super::super) fn all(&self, scheduler: &str) -> Vec<JobDefinition> {
        self.rows
            .iter()
            .filter(|((s, _), _)| s == scheduler)
            .map(|(_, definition)| definition.clone())
            .collect()
    }

    /// [`Definitions::job_definition`](super::super::Definitions::job_definition).
    pub(in super::super) fn one(&self, scheduler: &str, job: &str) -> Option<JobDefinition> {
        self.rows
            .get(&(scheduler.to_owned(), job.to_owned()))
            .cloned()
    }
}
