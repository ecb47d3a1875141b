set terminal pngcairo size 900,600 noenhanced
set grid
set key top left
set output 'docs/results/real/fig15.png'
set title 'fig15'
set xlabel 'K-means'
set ylabel 'mean TPOT vs best baseline (%)'
$d0 << EOD
"balanced" -5.88871 -0.588436 -5.30028
"vanilla" -2.91811 2.96504 -5.88315
EOD
set style data histograms
set style fill solid 0.6
set boxwidth 0.8
plot $d0 using 2:xtic(1) title 'gain_pct', $d0 using 3:xtic(1) title 'control_pct', $d0 using 4:xtic(1) title 'net_pct'
