//! One declaration for the `with_*` builder setters of the configuration types.

/// Declares builder methods `$vis fn with_x(mut self, arg: T) -> Self`, each setting one field
/// and returning `self`: `=> field` stores the argument as it is, `=> field = value` stores
/// `value` (a conversion of the argument, such as `Some(bytes)`). Used inside an `impl` block.
macro_rules! setters {
    ($(
        $(#[$meta:meta])*
        $vis:vis fn $name:ident($arg:ident: $ty:ty) => $field:ident $(= $value:expr)?;
    )+) => {
        $(
            $(#[$meta])*
            $vis fn $name(mut self, $arg: $ty) -> Self {
                self.$field = $crate::setters::setters!(@value $arg $(, $value)?);
                self
            }
        )+
    };
    (@value $arg:ident) => {
        $arg
    };
    (@value $arg:ident, $value:expr) => {
        $value
    };
}

pub(crate) use setters;

#[cfg(test)]
mod tests {
    #[derive(Debug, Default, PartialEq)]
    struct Sample {
        n: usize,
        name: Option<String>,
    }

    impl Sample {
        setters! {
            fn with_n(n: usize) => n;
            fn with_name(name: impl Into<String>) => name = Some(name.into());
        }
    }

    #[test]
    fn setters_store_their_argument_or_its_conversion() {
        let s = Sample::default().with_n(3).with_name("x");
        assert_eq!(
            s,
            Sample {
                n: 3,
                name: Some("x".into())
            }
        );
    }
}
