set terminal pngcairo size 900,600 noenhanced
set grid
set key top left
set output 'docs/results/realistic/table2.png'
set title 'table2'
set xlabel 'decode workers'
set ylabel 'mean TPOT vs best baseline (%)'
$d0 << EOD
8 -8.88481 -1.14682 -7.73799
16 -9.32389 -1.20895 -8.11495
24 -9.46841 -1.22674 -8.24167
EOD
plot $d0 using 1:2 with linespoints title 'gain_pct', $d0 using 1:3 with linespoints title 'control_pct', $d0 using 1:4 with linespoints title 'net_pct'
