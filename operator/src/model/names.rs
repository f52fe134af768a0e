//! Lists of names an agent item gives (audiences, a scope ceiling, required labels, secrets),
//! shared by every agent that gives the same list in one agent list, and by an agent whose
//! list did not change with the list it replaces (docs/performance.md#shared-names-and-bindings-by-agent-the-twelfth-run).
//!
//! Most agents of a fleet name the same few audiences, scopes and labels. As a `Vec<String>`
//! each list was 24 bytes in its agent and two allocations of its own: ~4 MB over 20,000
//! agents, twice over while a new agent list is read beside the old one.

use rustc_hash::FxHashSet as HashSet;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::sync::{Arc, LazyLock};

/// A name, shared (the same type as `model::Id`).
type Id = Arc<str>;

/// A list of names, shared: cloning it copies a pointer.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Names(Arc<[Id]>);

static EMPTY: LazyLock<Names> = LazyLock::new(|| Names(Arc::from(Vec::<Id>::new())));

impl Names {
    /// The names, as plain strings.
    pub fn strs(&self) -> impl Iterator<Item = &str> + '_ {
        self.0.iter().map(|n| &**n)
    }

    /// The names as owned strings, for what keeps its own copy.
    pub fn to_strings(&self) -> Vec<String> {
        self.strs().map(str::to_string).collect()
    }
}

impl Default for Names {
    /// The empty list, shared too.
    fn default() -> Names {
        EMPTY.clone()
    }
}

impl std::ops::Deref for Names {
    type Target = [Id];
    fn deref(&self) -> &[Id] {
        &self.0
    }
}

impl std::borrow::Borrow<[Id]> for Names {
    fn borrow(&self) -> &[Id] {
        &self.0
    }
}

impl std::fmt::Debug for Names {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.strs()).finish()
    }
}

impl<S: AsRef<str>> FromIterator<S> for Names {
    fn from_iter<I: IntoIterator<Item = S>>(iter: I) -> Names {
        let v: Vec<Id> = iter.into_iter().map(|s| Id::from(s.as_ref())).collect();
        if v.is_empty() {
            return Names::default();
        }
        Names(Arc::from(v))
    }
}

impl<S: AsRef<str>> From<Vec<S>> for Names {
    fn from(v: Vec<S>) -> Names {
        v.into_iter().collect()
    }
}

impl<S: AsRef<str>, const N: usize> From<[S; N]> for Names {
    fn from(v: [S; N]) -> Names {
        v.into_iter().collect()
    }
}

impl<S: AsRef<str>> PartialEq<Vec<S>> for Names {
    fn eq(&self, other: &Vec<S>) -> bool {
        self.len() == other.len() && self.strs().zip(other).all(|(a, b)| a == b.as_ref())
    }
}

impl Serialize for Names {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.strs())
    }
}

impl<'de> Deserialize<'de> for Names {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Names, D::Error> {
        Vec::<Box<str>>::deserialize(d).map(Names::from)
    }
}

/// The lists and names met so far while an agent list is read: each list read is swapped
/// for the equal one met before, so that equal lists are one allocation.
#[derive(Default)]
pub struct Interner {
    lists: HashSet<Names>,
    names: HashSet<Id>,
}

impl Interner {
    /// The list equal to `list` met before, else `list` itself (its names shared with equal
    /// names met before), remembered from now on.
    pub fn list(&mut self, list: &mut Names) {
        if let Some(known) = self.lists.get(&*list.0) {
            *list = known.clone();
            return;
        }
        if list.is_empty() {
            *list = Names::default();
        } else {
            *list = Names(list.0.iter().map(|n| self.name(n)).collect());
        }
        self.lists.insert(list.clone());
    }

    /// `last` when `list` equals it (the same list of the agent before), else [`Interner::list`].
    pub fn share(&mut self, list: &mut Names, last: Option<&Names>) {
        match last {
            Some(last) if last == list => *list = last.clone(),
            _ => self.list(list),
        }
    }

    /// The name equal to `name` met before, else `name`, remembered from now on.
    fn name(&mut self, name: &Id) -> Id {
        if let Some(known) = self.names.get(&**name) {
            return known.clone();
        }
        self.names.insert(name.clone());
        name.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_lists_read_apart_become_one_allocation() {
        let mut interner = Interner::default();
        let mut a: Names = serde_json::from_str(r#"["mail", "zone=z1"]"#).unwrap();
        let mut b: Names = serde_json::from_str(r#"["mail", "zone=z1"]"#).unwrap();
        let mut c: Names = serde_json::from_str(r#"["zone=z1"]"#).unwrap();
        assert!(!Arc::ptr_eq(&a.0, &b.0));
        interner.list(&mut a);
        interner.list(&mut b);
        interner.list(&mut c);
        assert!(Arc::ptr_eq(&a.0, &b.0), "the second list is the first");
        assert!(Arc::ptr_eq(&a[1], &c[0]), "a name in two different lists is one string");
        assert_eq!(a, vec!["mail", "zone=z1"]);
        assert_eq!(serde_json::to_string(&b).unwrap(), r#"["mail","zone=z1"]"#);
    }

    /// Five lists in an agent: 16 bytes each where a `Vec<String>` was 24, so an agent is
    /// 248 bytes before its strings (it was 288).
    #[test]
    fn a_list_is_16_bytes_in_its_agent() {
        assert_eq!(std::mem::size_of::<Names>(), 16);
        assert_eq!(std::mem::size_of::<Option<Names>>(), 16);
        assert!(std::mem::size_of::<crate::model::Agent>() <= 248);
    }

    #[test]
    fn empty_lists_share_one_allocation_however_made() {
        let mut read: Names = serde_json::from_str("[]").unwrap();
        Interner::default().list(&mut read);
        let made: Names = Vec::<String>::new().into();
        assert!(Arc::ptr_eq(&read.0, &Names::default().0));
        assert!(Arc::ptr_eq(&made.0, &Names::default().0));
        assert_eq!(format!("{read:?}"), "[]");
    }
}
