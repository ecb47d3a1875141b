set terminal pngcairo size 900,600 noenhanced
set grid
set key top left
set output 'docs/results/real/fig16.png'
set title 'fig16'
set xlabel 'locality band tau'
set ylabel 'mean TPOT vs best baseline (%)'
$d0 << EOD
0 -1.76312 3.36016 -5.12328
0.05 -5.20832 0.0369085 -5.24523
0.1 -5.88871 -0.588436 -5.30028
0.2 -5.90868 -0.993752 -4.91493
0.5 -3.8398 -0.552204 -3.2876
1 -2.51005 -0.379051 -2.131
EOD
plot $d0 using 1:2 with linespoints title 'gain_pct', $d0 using 1:3 with linespoints title 'control_pct', $d0 using 1:4 with linespoints title 'net_pct'
