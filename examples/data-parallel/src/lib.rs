//! data-parallel: trains a linear regression data-parallel on a mesh of
//! procs. The data never passes through the program: it is made on the
//! procs and stays there, and the program holds handles.
//!
//! - `X` (`rows x features`, seeded normal) is split by rows over the
//!   `procs` dimension; each rank holds its own block of examples.
//! - The targets are `y = X w*` for a known `w*`, computed on each rank.
//! - Each step, every rank computes the gradient of the squared error on
//!   its shard, `Xᵢᵀ (Xᵢ w - yᵢ)`: partial sums over `procs`. The gradient
//!   is all-reduced across the mesh (summed in the multicast tree on the
//!   way up), then applied on every rank: `w -= lr / rows * g`.
//! - The loss (the mean squared error, all-reduced the same way) is
//!   fetched and printed as `step N loss X`, and must fall every step.
//!
//! ```text
//! monarch-host run data_parallel.wasm -- [--procs 4] [--steps 20] [--device cpu|cuda|cuda:N]
//!                                       [--rows 4096] [--features 16] [--lr 0.5]
//! ```

use monarch_guest::prelude::*;
use monarch_guest::tensor::{DType, Device, Init, Sharding, TensorEngine};

/// The settings, from the program's arguments.
struct Options {
    procs: u32,
    steps: u32,
    device: Device,
    rows: u64,
    features: u64,
    lr: f64,
}

impl Options {
    fn parse(args: &[String]) -> Result<Options, String> {
        let mut options = Options {
            procs: 4,
            steps: 20,
            device: Device::Cpu,
            rows: 4096,
            features: 16,
            lr: 0.5,
        };
        let mut args = args.iter();
        while let Some(flag) = args.next() {
            let mut value = || {
                args.next()
                    .ok_or_else(|| format!("{flag} needs a value"))
                    .cloned()
            };
            fn number<T: std::str::FromStr>(flag: &str, v: String) -> Result<T, String> {
                v.parse()
                    .map_err(|_| format!("{flag}: `{v}` is not a valid number"))
            }
            match flag.as_str() {
                "--procs" => options.procs = number(flag, value()?)?,
                "--steps" => options.steps = number(flag, value()?)?,
                "--rows" => options.rows = number(flag, value()?)?,
                "--features" => options.features = number(flag, value()?)?,
                "--lr" => options.lr = number(flag, value()?)?,
                "--device" => options.device = value()?.parse()?,
                other => {
                    return Err(format!(
                        "unknown argument `{other}`; expected --procs, --steps, --device, --rows, --features or --lr"
                    ));
                }
            }
        }
        if options.procs == 0 || options.steps == 0 || options.features == 0 {
            return Err("--procs, --steps and --features must be at least 1".into());
        }
        if options.rows < u64::from(options.procs) {
            return Err(format!(
                "--rows ({}) must be at least --procs ({}): every rank needs examples",
                options.rows, options.procs
            ));
        }
        Ok(options)
    }
}

async fn main(args: Vec<String>) -> Result<(), String> {
    let o = Options::parse(&args)?;
    let procs = spawn_procs(&extent!(procs = o.procs))?;
    let engine = TensorEngine::spawn(&procs)?;
    info!(
        "training linear regression on {} examples x {} features, split by rows over {} procs, on {:?}",
        o.rows, o.features, o.procs, o.device
    );

    // The data, made on the procs: X split by rows, w* replicated.
    let rows = Sharding::shard("procs", 0);
    let f32s = DType::F32;
    let init = Init::Normal {
        mean: 0.0,
        std: 1.0,
        seed: 42,
    };
    let x = engine.create(&[o.rows, o.features], f32s, o.device, rows, init);
    let truth: Vec<f32> = (0..o.features).map(|i| i as f32 * 0.25 - 1.0).collect();
    let w_true = engine.from_slice(&truth, &[o.features, 1], o.device, Sharding::Replicate);
    let y = x.matmul(&w_true); // [rows, 1], split by rows like X
    let xt = x.t(); // [features, rows], split by columns
    let w = engine.create(
        &[o.features, 1],
        f32s,
        o.device,
        Sharding::Replicate,
        Init::Zeros,
    );

    let mut losses = Vec::new();
    for step in 1..=o.steps {
        // Every rank on its own shard: residual and gradient.
        let residual = x.matmul(&w).sub(&y);
        let gradient = xt.matmul(&residual); // partial sums over `procs`
        let loss = residual.mul(&residual).sum().div_scalar(o.rows as f64);
        // Across the mesh: sum the gradient and the loss, then apply.
        let (reduced, loss_reduced) = (gradient.all_reduce("procs"), loss.all_reduce("procs"));
        w.axpy(-o.lr / o.rows as f64, &gradient);
        reduced
            .await
            .map_err(|e| format!("step {step}: all-reduce of the gradient: {e}"))?;
        loss_reduced
            .await
            .map_err(|e| format!("step {step}: all-reduce of the loss: {e}"))?;
        let loss = loss
            .item()
            .await
            .map_err(|e| format!("step {step}: fetching the loss: {e}"))?;
        info!("step {step} loss {loss:.4e}");
        losses.push(loss);
    }

    let learned: Vec<f32> = w.fetch().await.map_err(|e| format!("fetching w: {e}"))?;
    let error = learned
        .iter()
        .zip(&truth)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    info!("learned w is within {error:.2e} of the true w (largest difference)");
    // Below this the loss is at f32's precision and may wobble.
    let floor = losses[0] * 1e-8;
    if let Some(pair) = losses
        .windows(2)
        .find(|pair| pair[1] >= pair[0] && pair[0] > floor)
    {
        return Err(format!(
            "the loss did not fall: {:.4e} then {:.4e}",
            pair[0], pair[1]
        ));
    }
    info!(
        "the loss fell every step, from {:.4e} to {:.4e}",
        losses[0],
        losses[losses.len() - 1]
    );
    procs.stop();
    Ok(())
}

fn args(text: &str) -> Vec<String> {
    text.split_whitespace().map(String::from).collect()
}

#[monarch_guest::test]
async fn training_over_two_procs_lowers_the_loss_every_step() -> Result<(), String> {
    // main fails unless the loss fell every step and w was learned.
    main(args("--procs 2 --steps 6 --rows 512")).await
}

#[monarch_guest::test]
async fn bad_options_are_refused_by_name() -> Result<(), String> {
    let err = main(args("--procs 0")).await.unwrap_err();
    assert!(err.contains("--procs, --steps and --features"), "{err}");
    let err = main(args("--rows 2 --procs 4")).await.unwrap_err();
    assert!(
        err.contains("--rows (2) must be at least --procs (4)"),
        "{err}"
    );
    let err = main(args("--steps many")).await.unwrap_err();
    assert!(err.contains("`many` is not a valid number"), "{err}");
    Ok(())
}

monarch_guest::program! {
    main: main,
}
