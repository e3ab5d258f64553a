//! Whether the daemon's own DaemonSet is being deleted: an uninstall
//! (`kubectl delete -k`, `helm uninstall`), after which the daemon cleans
//! the node as it exits (`crate::core::cleanup`), as opposed to a
//! rollout, a restart, or the DaemonSet replaced by one of the same name
//! (`kubectl delete ds --cascade=orphan` then `kubectl apply`, `kubectl
//! replace --force`), after which the next pod takes over what is there.
//!
//! A watch of the one DaemonSet (a field selector on its name, which RBAC
//! can grant by `resourceNames`) runs from the start, so it is in place
//! before an uninstall removes our RBAC and service account: the API
//! server authorizes a watch when it opens, and an open watch keeps
//! delivering. An uninstall is a fact about one DaemonSet, its UID: the
//! watch follows the UID it sees (`Mark`); that UID's deletion (or a
//! `deletionTimestamp` on it) marks the uninstall, and a DaemonSet seen
//! without a `deletionTimestamp` (a new UID that replaced it, or the same
//! one seen again) clears the mark. At exit a marked uninstall is checked
//! once more with a GET (`verdict`): the node is cleaned only when the
//! UID is gone or being deleted and no DaemonSet of that name with another
//! UID exists. Without API access, or when the DaemonSet is not found at
//! start, it says so once and an exit never cleans.

use k8s_openapi::api::apps::v1::DaemonSet;
use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use tokio_stream::StreamExt;
use tracing::{info, warn};

/// The DaemonSet that runs this daemon: its namespace and name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    /// The namespace (the pod's, from the downward API).
    pub namespace: String,
    /// The DaemonSet's name.
    pub name: String,
}

/// What the watch knows of our DaemonSet: the UID it follows and whether
/// that one is going away. A plain state machine, fed by [`Mark::observe`].
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Mark {
    /// The UID of the DaemonSet followed: the first one seen, then the one
    /// that replaced it.
    uid: Option<String>,
    /// Whether that DaemonSet is deleted or being deleted.
    going: bool,
}

/// One thing the watch saw of the DaemonSet's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Seen<'a> {
    /// A DaemonSet of that name exists with this UID, being deleted or not.
    Applied {
        /// Its `metadata.uid`.
        uid: &'a str,
        /// Whether it has a `deletionTimestamp`.
        deleting: bool,
    },
    /// The DaemonSet with this UID was deleted.
    Deleted {
        /// Its `metadata.uid`.
        uid: &'a str,
    },
    /// A (re-)listing found no DaemonSet of that name: one followed was
    /// deleted while the watch was reconnecting.
    ListedNone,
}

impl Mark {
    /// Whether the followed DaemonSet is going away.
    pub(crate) fn is_going(&self) -> bool {
        self.going
    }

    /// Takes in one sighting; returns a sentence when whether an uninstall
    /// is under way changed (or whose DaemonSet is followed).
    pub(crate) fn observe(&mut self, seen: Seen<'_>) -> Option<String> {
        match seen {
            Seen::Applied { uid, deleting } => {
                let replaced = self.uid.as_deref().is_some_and(|u| u != uid);
                let first = self.uid.is_none();
                let was = std::mem::replace(&mut self.going, deleting);
                let old = self.uid.replace(uid.to_string());
                match (first, replaced, was, deleting) {
                    (_, _, false, true) => Some(format!(
                        "our DaemonSet (uid {uid}) is being deleted: this node is cleaned when the daemon exits, if it is still gone then"
                    )),
                    (_, true, _, false) => Some(format!(
                        "a new DaemonSet of our name (uid {uid}) replaced uid {}: not an uninstall{}",
                        old.unwrap_or_default(),
                        if was {
                            "; the uninstall mark is cleared"
                        } else {
                            ""
                        }
                    )),
                    (_, false, true, false) => Some(format!(
                        "our DaemonSet (uid {uid}) is there again: the uninstall mark is cleared"
                    )),
                    _ => None,
                }
            }
            Seen::Deleted { uid } => {
                if self.uid.as_deref().is_some_and(|u| u != uid) || self.going {
                    return None;
                }
                self.uid = Some(uid.to_string());
                self.going = true;
                Some(format!(
                    "our DaemonSet (uid {uid}) was deleted: this node is cleaned when the daemon exits, if it is still gone then"
                ))
            }
            Seen::ListedNone => {
                let uid = self.uid.as_deref()?;
                if self.going {
                    return None;
                }
                self.going = true;
                Some(format!(
                    "our DaemonSet (uid {uid}) is no longer listed: this node is cleaned when the daemon exits, if it is still gone then"
                ))
            }
        }
    }
}

/// What a GET of the DaemonSet's name answered at exit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Lookup {
    /// No DaemonSet of that name (404).
    Gone,
    /// A DaemonSet of that name.
    Found {
        /// Its `metadata.uid`.
        uid: String,
        /// Whether it has a `deletionTimestamp`.
        deleting: bool,
    },
    /// The API server answered, refusing us (401 or 403): the uninstall
    /// removes our RBAC and service account with the DaemonSet.
    Refused(String),
    /// No answer (the API server unreachable, a timeout, a 5xx).
    Unreachable(String),
}

/// Whether an exit cleans the node, and why, in one sentence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// An uninstall: the node is cleaned.
    Clean(String),
    /// Not an uninstall (or not one that can be told): nothing is removed.
    Keep(String),
}

/// The exit's decision from what the watch saw (`mark`) and what the API
/// says now (`now`): clean only when the followed UID is gone or being
/// deleted and no DaemonSet of that name with another UID exists. A
/// refusal (our RBAC deleted) confirms what the watch saw; no answer at all
/// never cleans.
pub(crate) fn verdict(mark: &Mark, now: Lookup) -> Verdict {
    let uid = mark.uid.as_deref().unwrap_or("?");
    if !mark.going {
        return Verdict::Keep(format!(
            "our DaemonSet (uid {uid}) is not being deleted: a rollout, a restart or an eviction"
        ));
    }
    match now {
        Lookup::Gone => Verdict::Clean(format!(
            "our DaemonSet (uid {uid}) is gone and none of its name exists"
        )),
        Lookup::Found {
            uid: found,
            deleting,
        } if found == uid => {
            if deleting {
                Verdict::Clean(format!("our DaemonSet (uid {uid}) is being deleted"))
            } else {
                Verdict::Keep(format!(
                    "our DaemonSet (uid {uid}) is there and not being deleted"
                ))
            }
        }
        Lookup::Found { uid: found, .. } => Verdict::Keep(format!(
            "our DaemonSet (uid {uid}) was deleted, but a DaemonSet of its name exists (uid {found}): it was replaced"
        )),
        Lookup::Refused(why) => Verdict::Clean(format!(
            "our DaemonSet (uid {uid}) was deleted and the API server now refuses us ({why}): the uninstall removed our RBAC with it"
        )),
        Lookup::Unreachable(why) => Verdict::Keep(format!(
            "our DaemonSet (uid {uid}) was seen deleted, but the API server cannot be asked whether it still is ({why})"
        )),
    }
}

/// How long the exit's GET of the DaemonSet may take.
const ASK_API: Duration = Duration::from_secs(3);

/// The mark the watch task feeds and an exit reads, and the wake-up of an
/// exit waiting for it.
#[derive(Debug, Clone, Default)]
struct Shared {
    mark: Arc<Mutex<Mark>>,
    changed: Arc<Notify>,
}

impl Shared {
    fn get(&self) -> Mark {
        self.mark.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Feeds one sighting to the mark, logging a change and waking a
    /// waiting exit.
    fn observe(&self, seen: Seen<'_>) {
        let said = self
            .mark
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .observe(seen);
        if let Some(said) = said {
            info!("{said}");
            self.changed.notify_waiters();
        }
    }

    /// The mark once it says the DaemonSet is going, or as it is after
    /// `wait`: a SIGTERM of an uninstall can come a moment before the
    /// watch's event.
    async fn going_within(&self, wait: Duration) -> Mark {
        let notified = self.changed.notified();
        let mark = self.get();
        if mark.is_going() {
            return mark;
        }
        let _ = tokio::time::timeout(wait, notified).await;
        self.get()
    }
}

/// What the watch knows (its [`Mark`]) and the client to ask again at exit.
/// The default has no watch behind it and never cleans.
#[derive(Clone, Default)]
pub(crate) struct Uninstall {
    shared: Shared,
    /// The client and DaemonSet of the watch, when one runs (or ran).
    api: Option<(kube::Client, Owner)>,
}

impl std::fmt::Debug for Uninstall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Uninstall")
            .field("mark", &self.shared.get())
            .field("owner", &self.api.as_ref().map(|(_, o)| o))
            .finish()
    }
}

impl Uninstall {
    /// Whether this exit cleans the node: `None` without a watch (nothing
    /// can tell, which the start said once); otherwise the [`verdict`] from
    /// the watch's mark (waiting up to `wait` for it) and, when it is
    /// marked, a GET of the DaemonSet.
    pub(crate) async fn decide(&self, wait: Duration) -> Option<Verdict> {
        let (client, owner) = self.api.clone()?;
        let mark = self.shared.going_within(wait).await;
        if !mark.is_going() {
            return Some(verdict(&mark, Lookup::Unreachable("not asked".into())));
        }
        Some(verdict(&mark, lookup(client, &owner).await))
    }

    /// Watches `owner` with `client` in a task, feeding the mark; the task
    /// ends when the watch cannot go on.
    pub(crate) fn watch(client: kube::Client, owner: Owner) -> (Self, tokio::task::JoinHandle<()>) {
        let shared = Shared::default();
        let task = tokio::spawn(run(client.clone(), owner.clone(), shared.clone()));
        (
            Self {
                shared,
                api: Some((client, owner)),
            },
            task,
        )
    }
}

/// A GET of `owner`, bounded by [`ASK_API`].
async fn lookup(client: kube::Client, owner: &Owner) -> Lookup {
    let api: Api<DaemonSet> = Api::namespaced(client, &owner.namespace);
    match tokio::time::timeout(ASK_API, api.get_opt(&owner.name)).await {
        Err(_) => Lookup::Unreachable(format!("no answer within {} s", ASK_API.as_secs())),
        Ok(Ok(None)) => Lookup::Gone,
        Ok(Ok(Some(ds))) => Lookup::Found {
            uid: ds.metadata.uid.unwrap_or_default(),
            deleting: ds.metadata.deletion_timestamp.is_some(),
        },
        Ok(Err(kube::Error::Api(status))) if status.code == 401 || status.code == 403 => {
            Lookup::Refused(format!("{} {}", status.code, status.message))
        }
        Ok(Err(e)) => Lookup::Unreachable(e.to_string()),
    }
}

async fn run(client: kube::Client, owner: Owner, state: Shared) {
    let api: Api<DaemonSet> = Api::namespaced(client, &owner.namespace);
    let cfg = watcher::Config::default().fields(&format!("metadata.name={}", owner.name));
    let mut stream = std::pin::pin!(watcher::watcher(api, cfg).default_backoff());
    // Whether the listing under way (or the last one) found the DaemonSet.
    let mut listed = false;
    let mut failing = false;
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(Event::Delete(ds)) => state.observe(Seen::Deleted {
                uid: ds.metadata.uid.as_deref().unwrap_or_default(),
            }),
            Ok(Event::Apply(ds) | Event::InitApply(ds)) => {
                listed = true;
                failing = false;
                state.observe(Seen::Applied {
                    uid: ds.metadata.uid.as_deref().unwrap_or_default(),
                    deleting: ds.metadata.deletion_timestamp.is_some(),
                });
            }
            Ok(Event::Init) => listed = false,
            Ok(Event::InitDone) if !listed => {
                if state.get().uid.is_none() {
                    warn!(
                        namespace = %owner.namespace,
                        daemonset = %owner.name,
                        "our DaemonSet is not there: an exit never cleans this node (check --owner-daemonset and POD_NAMESPACE)"
                    );
                    return;
                }
                failing = false;
                state.observe(Seen::ListedNone);
            }
            Ok(Event::InitDone) => failing = false,
            Err(e) if !failing => {
                failing = true;
                warn!(error = %e, "watching our DaemonSet failed; retrying (meanwhile an exit decides from what the watch saw before and a GET)");
            }
            Err(_) => {}
        }
    }
}

/// The uninstall watch from the environment: on when `owner` is set and API
/// credentials are found, otherwise off (a default [`Uninstall`] never
/// marks), which is logged once.
pub(crate) async fn from_environment(owner: Option<Owner>) -> Uninstall {
    let Some(owner) = owner else {
        info!("cleaning the node at an uninstall is off: no --owner-daemonset and POD_NAMESPACE");
        return Uninstall::default();
    };
    let client = match kube::Config::infer()
        .await
        .map_err(|e| e.to_string())
        .and_then(|c| kube::Client::try_from(c).map_err(|e| e.to_string()))
    {
        Ok(c) => c,
        Err(e) => {
            info!(error = %e, "cleaning the node at an uninstall is off: no API access");
            return Uninstall::default();
        }
    };
    info!(namespace = %owner.namespace, daemonset = %owner.name, "watching our DaemonSet, to clean this node if it is deleted");
    Uninstall::watch(client, owner).0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn applied(uid: &str) -> Seen<'_> {
        Seen::Applied {
            uid,
            deleting: false,
        }
    }

    fn deleting(uid: &str) -> Seen<'_> {
        Seen::Applied {
            uid,
            deleting: true,
        }
    }

    fn fed(seen: &[Seen<'_>]) -> Mark {
        let mut m = Mark::default();
        for s in seen {
            m.observe(*s);
        }
        m
    }

    fn cleans(v: &Verdict) -> bool {
        matches!(v, Verdict::Clean(_))
    }

    #[test]
    fn a_deletion_of_our_daemonset_cleans_when_it_is_still_gone_at_exit() {
        for seen in [
            &[applied("a"), Seen::Deleted { uid: "a" }][..],
            &[applied("a"), deleting("a")],
            &[applied("a"), deleting("a"), Seen::Deleted { uid: "a" }],
            &[applied("a"), Seen::ListedNone],
        ] {
            let m = fed(seen);
            assert!(m.is_going(), "{seen:?}");
            assert!(cleans(&verdict(&m, Lookup::Gone)), "{seen:?}");
            let still_deleting = Lookup::Found {
                uid: "a".into(),
                deleting: true,
            };
            assert!(cleans(&verdict(&m, still_deleting)), "{seen:?}");
        }
    }

    #[test]
    fn an_orphan_delete_then_apply_is_not_an_uninstall() {
        // kubectl delete ds --cascade=orphan, then kubectl apply -k.
        let m = fed(&[applied("a"), Seen::Deleted { uid: "a" }, applied("b")]);
        assert!(!m.is_going(), "{m:?}");
        assert!(!cleans(&verdict(&m, Lookup::Gone)));
        // The exit came before the watch saw the new one: the GET does.
        let m = fed(&[applied("a"), Seen::Deleted { uid: "a" }]);
        let v = verdict(
            &m,
            Lookup::Found {
                uid: "b".into(),
                deleting: false,
            },
        );
        assert!(!cleans(&v), "{v:?}");
        let Verdict::Keep(why) = v else {
            unreachable!()
        };
        assert!(why.contains("replaced"), "{why}");
    }

    #[test]
    fn a_forced_replace_is_not_an_uninstall() {
        // kubectl replace --force: the old one deleted (foreground or not),
        // a new one of the same name created.
        let m = fed(&[
            applied("a"),
            deleting("a"),
            Seen::Deleted { uid: "a" },
            applied("b"),
        ]);
        assert!(!m.is_going(), "{m:?}");
        // Even a new UID that is itself being deleted is not the old one
        // coming back: the mark follows it.
        let m = fed(&[applied("a"), applied("b"), deleting("b")]);
        assert!(m.is_going());
        assert!(cleans(&verdict(&m, Lookup::Gone)));
    }

    #[test]
    fn only_the_followed_uids_deletion_marks() {
        let m = fed(&[applied("b"), Seen::Deleted { uid: "a" }]);
        assert!(!m.is_going(), "another UID's deletion marked: {m:?}");
        // Nothing listed before anything was seen marks nothing.
        assert!(!fed(&[Seen::ListedNone]).is_going());
    }

    #[test]
    fn the_same_daemonset_seen_again_without_a_deletion_clears_the_mark() {
        let m = fed(&[applied("a"), deleting("a"), applied("a")]);
        assert!(!m.is_going(), "{m:?}");
        let v = verdict(
            &fed(&[applied("a"), Seen::Deleted { uid: "a" }]),
            Lookup::Found {
                uid: "a".into(),
                deleting: false,
            },
        );
        assert!(!cleans(&v), "{v:?}");
    }

    #[test]
    fn an_api_that_cannot_be_asked_at_exit_never_cleans_one_that_refuses_confirms() {
        let m = fed(&[applied("a"), Seen::Deleted { uid: "a" }]);
        let v = verdict(&m, Lookup::Unreachable("connection refused".into()));
        let Verdict::Keep(why) = v else {
            panic!("cleaned without an answer: {v:?}")
        };
        assert!(why.contains("connection refused"), "{why}");
        // The uninstall deletes our RBAC with the DaemonSet: a 403 now is
        // what it looks like.
        assert!(cleans(&verdict(
            &m,
            Lookup::Refused("403 forbidden".into())
        )));
        // Without a mark nothing is asked, whatever the API would say.
        assert!(!cleans(&verdict(&fed(&[applied("a")]), Lookup::Gone)));
    }

    #[tokio::test]
    async fn a_mark_wakes_a_waiting_exit() {
        let s = Shared::default();
        s.observe(applied("a"));
        assert!(!s.going_within(Duration::from_millis(1)).await.is_going());
        let waiter = {
            let s = s.clone();
            tokio::spawn(async move { s.going_within(Duration::from_secs(30)).await })
        };
        // The waiter may not wait yet: mark (again) until it returns.
        while !waiter.is_finished() {
            s.observe(Seen::Deleted { uid: "a" });
            s.changed.notify_waiters();
            tokio::task::yield_now().await;
        }
        assert!(waiter.await.unwrap().is_going());
    }

    /// Without a watch nothing can mark it: an exit does not wait.
    #[tokio::test]
    async fn without_a_watch_an_exit_does_not_wait() {
        let u = Uninstall::default();
        let answer =
            tokio::time::timeout(Duration::from_secs(60), u.decide(Duration::from_secs(3600)))
                .await;
        assert_eq!(answer, Ok(None), "it waited for a watch that is not there");
    }
}
