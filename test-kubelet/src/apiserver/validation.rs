//! The validation the real API server applies to an events.k8s.io/v1 Event
//! before it stores it.

/// What the API server checks of an events.k8s.io/v1 Event before storing
/// it (kubernetes/kubernetes `pkg/apis/core/validation/events.go`,
/// `ValidateEventCreate` for `events/v1`, and `validateV1EventSeries`), as
/// a list of the rules broken; in `namespace`, for a Node (cluster-scoped).
pub fn validate_event_v1(namespace: &str, e: &serde_json::Value) -> Vec<String> {
    let mut errs = Vec::new();
    let s = |k: &str| e[k].as_str().unwrap_or_default().to_string();
    let name = e["metadata"]["name"].as_str().unwrap_or_default();
    let dns_subdomain = !name.is_empty()
        && name.len() <= 253
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    if !dns_subdomain {
        errs.push(format!("metadata.name {name:?} is not a DNS subdomain"));
    }
    if s("eventTime").is_empty() {
        errs.push("eventTime: Required value".into());
    }
    if !["Normal", "Warning"].contains(&s("type").as_str()) {
        errs.push(format!(
            "type {:?} is neither Normal nor Warning",
            s("type")
        ));
    }
    for k in [
        "deprecatedFirstTimestamp",
        "deprecatedLastTimestamp",
        "deprecatedSource",
    ] {
        if e.get(k).is_some_and(|v| !v.is_null()) {
            errs.push(format!("{k}: needs to be unset"));
        }
    }
    if e["deprecatedCount"].as_i64().unwrap_or(0) != 0 {
        errs.push("deprecatedCount: needs to be unset".into());
    }
    let controller = s("reportingController");
    if controller.is_empty() || controller.len() > 316 || !controller.contains('/') {
        errs.push(format!(
            "reportingController {controller:?} is not a qualified name"
        ));
    }
    for (k, max) in [
        ("reportingInstance", 128),
        ("action", 128),
        ("reason", 128),
        ("note", 1024),
    ] {
        let v = s(k);
        if (v.is_empty() && k != "note") || v.len() > max {
            errs.push(format!("{k}: required, at most {max} characters"));
        }
    }
    // A cluster-scoped object's Events live in namespace default.
    if e["regarding"]["namespace"]
        .as_str()
        .unwrap_or_default()
        .is_empty()
        && namespace != "default"
    {
        errs.push(format!(
            "namespace {namespace} does not match the regarding object's"
        ));
    }
    if let Some(series) = e.get("series").filter(|v| !v.is_null()) {
        if series["count"].as_i64().unwrap_or(0) < 2 {
            errs.push("series.count: should be at least 2".into());
        }
        if series["lastObservedTime"]
            .as_str()
            .unwrap_or_default()
            .is_empty()
        {
            errs.push("series.lastObservedTime: Required value".into());
        }
    }
    errs
}
