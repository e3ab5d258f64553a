//! Kubernetes resource quantities (`16Mi`, `100m`) as the kubelet reads
//! them for a container's `linux.resources`.

use anyhow::{Context, Result, bail};
use serde_json::Value;

/// A Kubernetes memory quantity (`16Mi`, `1G`, `1048576`) in bytes.
pub fn memory_bytes(q: &Value, field: &str) -> Result<i64> {
    let s = match q {
        Value::Number(n) => n.to_string(),
        Value::String(s) => s.clone(),
        _ => bail!("{field}: {q} is not a quantity"),
    };
    let units: [(&str, i64); 8] = [
        ("Ki", 1 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("k", 1_000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
        ("T", 1_000_000_000_000),
    ];
    let (num, mult) = units
        .iter()
        .find_map(|(u, m)| s.strip_suffix(u).map(|n| (n, *m)))
        .unwrap_or((s.as_str(), 1));
    let n: i64 = num
        .parse()
        .with_context(|| format!("{field}: {s:?} is not a memory quantity this test reads"))?;
    Ok(n * mult)
}

/// A Kubernetes CPU quantity (`100m`, `1`, `0.5`) in millicores.
pub fn milli_cpu(q: &Value, field: &str) -> Result<i64> {
    let s = match q {
        Value::Number(n) => n.to_string(),
        Value::String(s) => s.clone(),
        _ => bail!("{field}: {q} is not a quantity"),
    };
    if let Some(m) = s.strip_suffix('m') {
        return m
            .parse()
            .with_context(|| format!("{field}: {s:?} is not a CPU quantity"));
    }
    let cores: f64 = s
        .parse()
        .with_context(|| format!("{field}: {s:?} is not a CPU quantity"))?;
    // Kubernetes rounds CPU quantities up to whole millicores.
    Ok((cores * 1000.0).ceil() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn quantities_read_as_the_kubelet_reads_them() {
        assert_eq!(memory_bytes(&json!("64Mi"), "m").unwrap(), 64 << 20);
        assert_eq!(memory_bytes(&json!("1G"), "m").unwrap(), 1_000_000_000);
        assert_eq!(memory_bytes(&json!(4096), "m").unwrap(), 4096);
        assert!(memory_bytes(&json!("1.5Gi"), "m").is_err());
        assert_eq!(milli_cpu(&json!("200m"), "c").unwrap(), 200);
        assert_eq!(milli_cpu(&json!("0.5"), "c").unwrap(), 500);
        assert_eq!(milli_cpu(&json!(2), "c").unwrap(), 2000);
    }
}
