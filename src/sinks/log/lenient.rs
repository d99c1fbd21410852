//! Readers for the log's fields that take what an older or a foreign
//! writer put there: a value of the wrong type reads as absent instead of
//! failing the whole line (the report must read any log it is given).

use serde::Deserialize;

/// A field that reads as `None` when its value has the wrong type.
pub(super) fn lenient<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::de::DeserializeOwned,
{
    let v = serde_json::Value::deserialize(d)?;
    Ok(serde_json::from_value(v).ok())
}

/// A list that keeps the entries that read, and is empty when it is not a
/// list.
pub(super) fn lenient_vec<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::de::DeserializeOwned,
{
    Ok(lenient_list(d)?.unwrap_or_default())
}

pub(super) fn lenient_list<'de, D, T>(d: D) -> Result<Option<Vec<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::de::DeserializeOwned,
{
    Ok(match serde_json::Value::deserialize(d)? {
        serde_json::Value::Array(a) => Some(
            a.into_iter()
                .filter_map(|v| serde_json::from_value(v).ok())
                .collect(),
        ),
        _ => None,
    })
}

/// A signal as a name: `"SIGKILL"` stays, a number becomes `signal 9`.
pub(super) fn signal_name<'de, D>(d: D) -> Result<Option<String>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    Ok(match serde_json::Value::deserialize(d)? {
        serde_json::Value::String(s) => Some(s),
        serde_json::Value::Number(n) => Some(format!("signal {n}")),
        _ => None,
    })
}

/// A device index, also when written as a string (`"0"`).
pub(super) fn device_index<'de, D>(d: D) -> Result<Option<u32>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    Ok(match serde_json::Value::deserialize(d)? {
        serde_json::Value::String(s) => s.trim().parse().ok(),
        v => v.as_u64().and_then(|n| u32::try_from(n).ok()),
    })
}

/// A role name, or for the richer shapes other writers may use
/// (`{"role": "worker", "index": 3}`), its `role` (or `name`) member.
pub(super) fn role_name<'de, D>(d: D) -> Result<Option<String>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Shape {
        Name(String),
        Object {
            role: Option<String>,
            name: Option<String>,
        },
        Other(serde::de::IgnoredAny),
    }
    Ok(match Shape::deserialize(d)? {
        Shape::Name(s) => Some(s),
        Shape::Object { role, name } => role.or(name),
        Shape::Other(_) => None,
    })
}

/// `true`, or any other value than `false` and null (a hint given as text).
pub(super) fn truthy<'de, D>(d: D) -> Result<bool, D::Error>
where
    D: serde::Deserializer<'de>,
{
    Ok(match serde_json::Value::deserialize(d)? {
        serde_json::Value::Bool(b) => b,
        v => !v.is_null(),
    })
}
