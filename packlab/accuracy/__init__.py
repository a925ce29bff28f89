"""What the loader's shortcuts cost the model, measured as accuracy (chapters 13 and 14).

Every shortcut the course teaches for speed changes what the model sees: the order of the
samples (a shuffle buffer instead of a global permutation), their pixels (a second lossy
encoding at the training size), how often each is seen (data echoing), and how several
sources are mixed. This package measures the price in the only currency that matters, the
accuracy of a trained model, while keeping everything else equal:

* :mod:`.pixels` decodes every image **once** into small arrays kept in memory, so that
  two training runs differ only in the thing compared, and so that dozens of runs fit in
  a chapter;
* :mod:`.training` trains :class:`packlab.train.TinyCNN` on a given schedule of batches
  and reports held-out accuracy, for several seeds at once on all cores;
* :mod:`.orders` produces the schedules: a global permutation, the course's tar reader
  with a shuffle buffer (the real code, reading real shards), and the peers' shuffles;
* :mod:`.echo` and :mod:`.mixing` build echoed schedules (with each echo copy's augmentation
  before or after the echo) and mixed sources;
* :mod:`.stored_crops` makes the same random crops of originals and of chapter 11's stored
  form, scaled down, so that training on either is a paired comparison;
* :mod:`.patterns` generates a task where only the spatial pattern gives the class (the
  colours are random per image), :mod:`.instrument` trains many seeds of a condition at once
  as one grouped model, paired across conditions, :mod:`.conditions` runs several conditions
  on all cores and proves on a planted effect what the instrument can see, and :mod:`.paired`
  turns paired seeds into a difference in points with an interval, a verdict and the
  smallest difference the comparison could have detected.
"""
