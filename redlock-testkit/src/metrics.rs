//! Reading metrics back in tests: a sample of a Prometheus text page (what
//! `metrics-exporter-prometheus` renders, or a scraped `/metrics`).

/// The value of the sample `name{labels}` in a Prometheus text page (labels as the
/// exporter writes them, e.g. `outcome="granted"`; empty for none), if present.
///
/// ```
/// let page = "# TYPE runs counter\nruns{job=\"a\"} 3\nleader 1\n";
/// assert_eq!(redlock_testkit::metrics::sample(page, "runs", r#"job="a""#), Some(3.0));
/// assert_eq!(redlock_testkit::metrics::sample(page, "leader", ""), Some(1.0));
/// assert_eq!(redlock_testkit::metrics::sample(page, "runs", r#"job="b""#), None);
/// ```
pub fn sample(page: &str, name: &str, labels: &str) -> Option<f64> {
    let prefix = if labels.is_empty() {
        format!("{name} ")
    } else {
        format!("{name}{{{labels}}} ")
    };
    page.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .and_then(|value| value.trim().parse().ok())
}
